"""logsumexp and cumsum where the op table's smooth inputs do not reach: infinities and
empty axes against PyTorch, integer and bool running sums, and what each new primitive
keeps for its derivatives."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback.ops import PRIMITIVES

INF = np.inf
EDGES = [
    np.array([[-INF, -INF, -INF], [1.0, -INF, 2.0]]),  # all -inf: -inf, not NaN
    np.array([[INF, 1.0, -INF], [INF, INF, 0.0]]),  # +inf wins
    np.array([[np.nan, 1.0, 2.0], [3.0, 4.0, 5.0]]),  # NaN stays NaN
    np.ones((2, 0)),  # an empty axis: log(0) = -inf
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("x", EDGES, ids=["minus_inf", "plus_inf", "nan", "empty"])
def test_logsumexp_at_infinities_and_empty_axes_matches_pytorch(x, dtype):
    x = x.astype(dtype)
    got = pb.logsumexp(pb.tensor(x), axis=1)
    want = torch.logsumexp(torch.from_numpy(x), dim=1).numpy()
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_])
def test_cumsum_of_ints_and_bools_widens_as_pytorch(dtype):
    x = (np.arange(12).reshape(3, 4) % 3).astype(dtype)
    got = pb.cumsum(pb.tensor(x), 1)
    want = torch.cumsum(torch.from_numpy(x), 1).numpy()
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.numpy(), want)


def test_the_new_primitives_keep_only_what_their_rules_read():
    kept = {name: (PRIMITIVES[name].saves_inputs, PRIMITIVES[name].saves_output)
            for name in ("sin", "cos", "logsumexp", "cumsum")}
    assert kept == {"sin": (True, False), "cos": (True, False), "logsumexp": (True, True),
                    "cumsum": (False, False)}
    assert PRIMITIVES["cumsum"].linear_args == frozenset((0,))


def test_cumsum_transposes_to_a_running_sum_from_the_end():
    ct = np.arange(1.0, 5.0)
    (back,) = pb.linear_transpose(lambda v: pb.cumsum(v, 0), np.zeros(4))(ct)
    np.testing.assert_array_equal(back.numpy(), [10.0, 9.0, 7.0, 4.0])
