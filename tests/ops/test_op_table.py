"""Every row of the op table through one set of checkers, against PyTorch: values,
gradients by fused backward kernels and by the primitives' rules, forward-mode JVPs,
and second derivatives by nested `pb.grad`, in float32 and float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from op_check import (
    DTYPES,
    assert_close,
    check_grads,
    output_cotangent,
    pb_grads_by_backward,
    pb_second,
    random_like,
    to_pb,
    to_torch,
    tolerance,
    torch_grads,
    torch_second,
    torch_value,
)
from op_table import ROWS, SECOND_ORDER_ROWS, OpSpec

import pullback as pb
from pullback.tensor.backward import fused_kernels

rows = pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
dtypes = pytest.mark.parametrize("dtype", DTYPES)


@rows
@dtypes
def test_op_value_matches_torch(row: OpSpec, dtype: np.dtype) -> None:
    arrays = row.inputs(dtype)
    got = row.pb_fn(*to_pb(arrays))
    assert isinstance(got, pb.Tensor)
    assert_close(got, torch_value(row, arrays), dtype, tolerance(row, dtype), row.name)


@rows
@dtypes
def test_op_gradient_with_fused_kernels_matches_torch(row: OpSpec, dtype: np.dtype) -> None:
    arrays = row.inputs(dtype)
    g = output_cotangent(row, arrays)
    grads = pb_grads_by_backward(row, arrays, g)
    check_grads(row, grads, arrays, torch_grads(row, arrays, g), tolerance(row, dtype))


@rows
@dtypes
def test_op_gradient_from_derivative_rules_matches_torch(row: OpSpec, dtype: np.dtype) -> None:
    arrays = row.inputs(dtype)
    g = output_cotangent(row, arrays)
    with fused_kernels(False):
        grads = pb_grads_by_backward(row, arrays, g)
    check_grads(row, grads, arrays, torch_grads(row, arrays, g), tolerance(row, dtype))


@rows
@dtypes
def test_op_jvp_matches_torch_func_jvp(row: OpSpec, dtype: np.dtype) -> None:
    arrays = row.inputs(dtype)
    tangents = [random_like(row, a.shape, dtype, f"/tangent{i}") for i, a in enumerate(arrays)]
    out, tangent_out = pb.jvp(row.pb_fn, to_pb(arrays), to_pb(tangents))
    want_out, want_tangent = torch.func.jvp(row.torch_fn, tuple(to_torch(arrays)),
                                            tuple(to_torch(tangents)))
    tol = tolerance(row, dtype)
    assert_close(out, want_out.numpy(), dtype, tol, f"{row.name}: jvp primal output")
    assert_close(tangent_out, want_tangent.numpy(), dtype, tol, f"{row.name}: jvp tangent")


@pytest.mark.parametrize("row", SECOND_ORDER_ROWS, ids=lambda r: r.name)
@dtypes
def test_op_second_derivative_matches_torch_double_backward(row: OpSpec, dtype: np.dtype) -> None:
    arrays = row.inputs(dtype)
    g = output_cotangent(row, arrays)
    hs = [random_like(row, a.shape, dtype, f"/direction{i}") for i, a in enumerate(arrays)]
    got = pb_second(row, arrays, g, hs)
    want = torch_second(row, arrays, g, hs)
    assert len(got) == len(arrays)
    for i, (value, expected) in enumerate(zip(got, want, strict=True)):
        assert_close(value, expected, dtype, tolerance(row, dtype, order=2),
                     f"{row.name}: second derivative in input {i}")


BY_NAME = {row.name: row for row in ROWS}


@pytest.mark.parametrize("name", ["exp", "mul_col_with_row", "matmul_matrix", "softmax_axis_0"])
def test_op_jvp_of_primals_that_require_grad_matches_torch(name: str) -> None:
    # Primals that require grad (model parameters) must not change what jvp computes.
    row, dtype = BY_NAME[name], np.dtype(np.float64)
    arrays = row.inputs(dtype)
    tangents = [random_like(row, a.shape, dtype, f"/tangent{i}") for i, a in enumerate(arrays)]
    _, tangent_out = pb.jvp(row.pb_fn, to_pb(arrays, requires_grad=True), to_pb(tangents))
    _, want = torch.func.jvp(row.torch_fn, tuple(to_torch(arrays, requires_grad=True)),
                             tuple(to_torch(tangents)))
    assert_close(tangent_out, want.detach().numpy(), dtype, tolerance(row, dtype), name)
