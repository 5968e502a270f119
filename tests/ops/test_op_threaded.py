"""Large-input rows on `ThreadedCpuBackend(num_threads=2)`: inputs big enough that its
elementwise, row-wise and reduction kernels split over threads must give PyTorch's values
and gradients, by fused backward kernels and by the primitives' rules."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from op_check import (
    DTYPES,
    assert_close,
    check_grads,
    output_cotangent,
    pb_grads_by_backward,
    to_pb,
    tolerance,
    torch_grads,
    torch_value,
)
from op_table import THREADED_ROWS, OpSpec

import pullback as pb
from pullback.tensor.backward import fused_kernels

rows = pytest.mark.parametrize("row", THREADED_ROWS, ids=lambda r: r.name)
dtypes = pytest.mark.parametrize("dtype", DTYPES)


@pytest.fixture(scope="module")
def threaded() -> Iterator[pb.ThreadedCpuBackend]:
    backend = pb.ThreadedCpuBackend(num_threads=2)
    yield backend
    backend.close()


def test_threaded_rows_are_large_enough_to_split(threaded: pb.ThreadedCpuBackend) -> None:
    for row in THREADED_ROWS:
        largest = max(int(np.prod(s)) for s in row.shapes)
        assert largest >= max(40_000, threaded.parallel_threshold), row.name


@rows
@dtypes
def test_threaded_op_value_matches_torch(threaded: pb.ThreadedCpuBackend, row: OpSpec,
                                         dtype: np.dtype) -> None:
    arrays = row.inputs(dtype)
    with pb.use_backend(threaded):
        got = row.pb_fn(*to_pb(arrays))
    assert_close(got, torch_value(row, arrays), dtype, tolerance(row, dtype), row.name)


@rows
@dtypes
@pytest.mark.parametrize("fused", [True, False], ids=["fused_kernels", "derivative_rules"])
def test_threaded_op_gradient_matches_torch(threaded: pb.ThreadedCpuBackend, row: OpSpec,
                                            dtype: np.dtype, fused: bool) -> None:
    arrays = row.inputs(dtype)
    g = output_cotangent(row, arrays)
    with pb.use_backend(threaded), fused_kernels(fused):
        grads = pb_grads_by_backward(row, arrays, g)
    check_grads(row, grads, arrays, torch_grads(row, arrays, g), tolerance(row, dtype))
