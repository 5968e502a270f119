"""How the NumPy backends lay out matrix products (backend.gemm): by columns where
the result has fewer rows than columns, with the same values either way; a broadcast
operand copied for BLAS."""

from __future__ import annotations

import numpy as np
import pytest

from pullback.backend import CpuBackend, ThreadedCpuBackend, gemm
from pullback.backend.gemm import MIN_ELEMENTS, result_order

FLOATS = [np.float32, np.float64]


def test_the_order_depends_on_the_result_shape_alone():
    assert result_order(256, 1024) == "F"
    assert result_order(1024, 256) == "C"
    assert result_order(512, 512) == "C"
    assert result_order(8, 16) == "C"  # small results stay by rows
    assert MIN_ELEMENTS > 8 * 16


@pytest.mark.parametrize("backend", [CpuBackend(), ThreadedCpuBackend(num_threads=2)],
                         ids=["cpu", "threaded"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_wide_products_come_by_columns_with_numpy_values(backend, dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 96)).astype(dtype)
    b = rng.standard_normal((96, 200)).astype(dtype)
    wide = backend.matmul(a, b)
    assert wide.flags.f_contiguous and not wide.flags.c_contiguous
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(wide, a.astype(np.float64) @ b, rtol=tol, atol=tol)
    tall = backend.matmul(b.T.copy(), a.T.copy())
    assert tall.flags.c_contiguous
    np.testing.assert_allclose(tall, wide.T, rtol=tol, atol=tol)
    # Batched, mixed-dtype and vector products keep NumPy's own layout and dtype.
    assert backend.matmul(a[None], b[None]).flags.c_contiguous
    assert backend.matmul(a, b.astype(np.float16)).dtype == np.result_type(a, np.float16)
    assert backend.matmul(a[0], b).shape == (200,)


def test_input_gradients_share_the_forward_layout_and_weight_gradients_the_weight():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 128)).astype(np.float32)
    w = rng.standard_normal((256, 128)).astype(np.float32)  # a dense layer's (out, in)
    y = CpuBackend().matmul(x, w.T)
    upstream = np.asfortranarray(rng.standard_normal(y.shape).astype(np.float32))
    grad_x, grad_wt = CpuBackend().matmul_backward(upstream, x, w.T)
    assert y.flags.f_contiguous and grad_x.flags.f_contiguous  # (32, 128): by columns
    assert grad_wt.T.flags.c_contiguous  # laid out like w once transposed back
    np.testing.assert_allclose(grad_x, upstream @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad_wt, x.T @ upstream, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("order", ["C", "F"])
def test_a_bias_gradient_sums_columns_as_closely_as_numpy(dtype, order):
    from pullback.backend.gemm import COLUMN_SUM_ROWS

    rng = np.random.default_rng(2)
    backend = CpuBackend()
    for rows in (2, 128, 1000, COLUMN_SUM_ROWS + 1):
        g = np.asarray(rng.standard_normal((rows, 48)).astype(dtype), order=order)
        exact = g.astype(np.float64).sum(axis=0)
        scale = np.abs(g).astype(np.float64).sum(axis=0)
        eps = np.finfo(dtype).eps
        for shape in ((48,), (1, 48)):
            got = backend.sum_to_shape(g, shape)
            assert got.shape == shape and got.dtype == dtype
            # Within a few ulps of the summed magnitudes (NumPy's own bound is similar).
            assert np.all(np.abs(got.reshape(-1) - exact) <= 8 * eps * scale)
    rows_sum = backend.sum_to_shape(g, (rows, 1))  # over the other axis
    assert rows_sum.shape == (rows, 1)
    exact = g.astype(np.float64).sum(axis=1, keepdims=True)
    assert np.all(np.abs(rows_sum - exact) <= 8 * eps * np.abs(g).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("dtype", FLOATS)
def test_a_convolution_bias_gradient_sums_each_channel(dtype):
    rng = np.random.default_rng(4)
    g = rng.standard_normal((6, 5, 7, 3)).astype(dtype)
    eps = np.finfo(dtype).eps
    for shape, axes in (((5, 1, 1), (0, 2, 3)), ((1, 5, 1, 1), (0, 2, 3)), ((7, 3), (0, 1)),
                        ((5, 7, 1), (0, 3)), ((6, 1, 1, 1), (1, 2, 3)), ((1,), (0, 1, 2, 3))):
        got = CpuBackend().sum_to_shape(g, shape)
        exact = g.astype(np.float64).sum(axis=axes, keepdims=True).reshape(shape)
        bound = 8 * eps * np.abs(g).astype(np.float64).sum(axis=axes, keepdims=True)
        assert got.shape == shape and got.dtype == dtype
        assert np.all(np.abs(got - exact) <= bound.reshape(shape)), shape
    # Axes that are not one block, and strided arrays, take NumPy's reduction.
    np.testing.assert_allclose(CpuBackend().sum_to_shape(g, (6, 1, 1, 3)),
                               g.sum(axis=(1, 2), keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(CpuBackend().sum_to_shape(g[:, ::2], (3, 1, 1)),
                               g[:, ::2].sum(axis=(0, 2, 3)).reshape(3, 1, 1), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("which", ["one value", "one row", "transposed"])
def test_a_broadcast_operand_goes_to_blas_as_a_copy_with_the_same_values(dtype, which):
    # NumPy's matmul multiplies a zero-strided operand in a loop of its own; gemm copies
    # it first (ONNX's light ResNet-50 keeps its classifier weight as one value).
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 40)).astype(dtype)
    b = {"one value": np.broadcast_to(dtype(0.25), (40, 30)),
         "one row": np.broadcast_to(rng.standard_normal(30).astype(dtype), (40, 30)),
         "transposed": np.broadcast_to(rng.standard_normal(40).astype(dtype), (30, 40)).T}[which]
    copied = gemm.blasable(b)
    assert 0 not in copied.strides and copied.flags.c_contiguous
    np.testing.assert_array_equal(copied, b)
    # Against the product in float64 of the same values, within what the order of a sum
    # of 40 terms may change (NumPy's own matmul of small arrays may not call BLAS).
    exact = a.astype(np.float64) @ np.array(b, np.float64)
    bound = 40 * np.finfo(dtype).eps * (np.abs(a).astype(np.float64) @ np.abs(np.array(b)))
    assert np.all(np.abs(CpuBackend().matmul(a, b) - exact) <= bound)
    square = np.ones((5, 5), dtype)
    assert gemm.blasable(square) is square  # strides of its own: as it is


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("shape", [(64, 96), (5, 40, 96), (512, 96)], ids=["wide", "stack", "tall"])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("dtype", FLOATS)
def test_a_products_bias_and_relu_in_its_epilogue_are_the_ops_one_by_one(
        dtype, relu, shape, split, residual, monkeypatch, forward_only):
    # Each part's block gets the bias (its columns' share, for a product by columns), the
    # residual's block and relu right after its product: bit for bit the product (cut
    # the same way), then add, add, relu; and the defaults in forward ops agree.
    from pullback.backend import blas
    from pullback.backend import split as split_module
    from pullback.backend.fused import fused_ops

    if split:
        monkeypatch.setattr(gemm, "SPLIT_MACS", 0)
        monkeypatch.setattr(blas, "_threaded", False)
        monkeypatch.setattr(split_module, "parts", lambda n: [(0, n // 3), (n // 3, n)])
    rng = np.random.default_rng(1)
    a = rng.standard_normal(shape).astype(dtype)
    b = rng.standard_normal((96, 200)).astype(dtype)
    bias = rng.standard_normal(200).astype(dtype)
    cpu = CpuBackend()
    added = rng.standard_normal(shape[:-1] + (200,)).astype(dtype) if residual else None
    got = cpu.matmul_epilogue(a, b, bias, relu, residual=added)
    want = cpu.add(cpu.matmul(a, b), bias)
    want = cpu.add(added, want) if residual else want  # as a residual connection adds
    want = cpu.relu(want) if relu else want
    np.testing.assert_array_equal(got, want)
    out = np.empty(want.shape, dtype, order="F" if got.flags.f_contiguous else "C")
    assert cpu.matmul_epilogue(a, b, bias, relu, out=out, residual=added) is out
    np.testing.assert_array_equal(out, want)
    default = fused_ops(forward_only).matmul_epilogue(a, b, bias, relu, residual=added)
    np.testing.assert_allclose(default, want, rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)
    if relu:
        assert (got == 0).any() and (got > 0).any()


def test_a_products_epilogue_refuses_nothing_it_cannot_take():
    # A bias of another length, or mixed dtypes: the ops one by one, with their errors.
    cpu = CpuBackend()
    a, b = np.ones((4, 3), np.float32), np.ones((3, 5), np.float32)
    with pytest.raises(Exception, match="add"):
        cpu.matmul_epilogue(a, b, np.ones(4, np.float32), False)
    mixed = cpu.matmul_epilogue(a, b, np.ones(5, np.float64), True)
    np.testing.assert_array_equal(mixed, cpu.relu(cpu.add(cpu.matmul(a, b), np.ones(5))))
