"""An op that changes nothing (a reshape to the same shape, a sum over no axis, an astype
to the same dtype, ...) gives a tensor back itself, and makes a tensor of a NumPy array,
as every other call of the op does: it used to hand the array back unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pullback as pb
from pullback import ops

CALLS: dict[str, Callable[[Any], Any]] = {
    "reshape": lambda x: pb.reshape(x, (2, 3)),
    "transpose": lambda x: pb.transpose(x, (0, 1)),
    "broadcast_to": lambda x: pb.broadcast_to(x, (2, 3)),
    "sum_to_shape": lambda x: ops.sum_to_shape(x, (2, 3)),
    "astype": lambda x: ops.astype(x, np.float64),
    "concatenate": lambda x: pb.concatenate([x]),
    "sum": lambda x: pb.sum(x, axis=()),
    "squeeze": lambda x: pb.squeeze(x),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_an_array_operand_gives_a_tensor(name: str) -> None:
    array = np.arange(6.0).reshape(2, 3)
    out = CALLS[name](array)
    assert isinstance(out, pb.Tensor), type(out).__name__
    np.testing.assert_array_equal(out.numpy(), array)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_tensor_is_given_back_itself(name: str) -> None:
    x = pb.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    assert CALLS[name](x) is x


@pytest.mark.parametrize("op", [pb.sort, lambda x: pb.topk(x, 1)], ids=["sort", "topk"])
def test_sorting_a_0d_array_gives_tensors(op: Callable[[Any], Any]) -> None:
    values, indices = op(np.array(3.0))
    assert isinstance(values, pb.Tensor) and isinstance(indices, pb.Tensor)
    assert values.item() == 3.0 and indices.item() == 0
    x = pb.tensor(3.0, requires_grad=True)
    assert op(x)[0] is x
