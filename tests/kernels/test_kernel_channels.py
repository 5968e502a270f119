"""Batch norm's channel kernels against NumPy formulas, their backward against central
differences, serial against parallel, and the CpuBackend methods (x transposed into
channel rows) against FusedOps' forward-op defaults."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_check import LARGE, vjp_check

from pullback.backend import CpuBackend, KernelError, ThreadedCpuBackend
from pullback.backend.fused import FusedOps
from pullback.kernels import channels, planes

EPS = 1e-5
TOL = {np.float32: {"rtol": 2e-5, "atol": 2e-6}, np.float64: {"rtol": 1e-12, "atol": 1e-13}}


def batch_norm_ref(x, w, b, eps=EPS):
    """(y, mean, biased var) over every axis but 1, in float64."""
    x = x.astype(np.float64)
    axes = (0, *range(2, x.ndim))
    column = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = x.mean(axes), x.var(axes)
    y = (x - mean.reshape(column)) / np.sqrt(var.reshape(column) + eps)
    return y * np.reshape(w, column) + np.reshape(b, column), mean, var


def _data(rng, shape, dtype, channel_axis=1):
    """x, and a weight and bias per channel (axis 1; axis 0 for the kernels' rows)."""
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    w, b = (rng.standard_normal(shape[channel_axis]).astype(dtype) for _ in range(2))
    return x, w, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_channel_kernels_match_numpy_formulas(rng, dtype):
    x, w, b = _data(rng, (3, 7), dtype, channel_axis=0)  # a row per channel
    got = channels.batch_norm.serial(x, w, b, EPS)
    want = batch_norm_ref(x.T, w, b)
    for g, ref in zip(got, (want[0].T, want[1], want[2])):
        assert g.dtype == dtype
        np.testing.assert_allclose(g, ref, **TOL[dtype])


def test_channel_backward_is_the_vjp_of_its_forward(rng):
    x, w, b = _data(rng, (3, 7), np.float64, channel_axis=0)
    vjp_check(lambda x, w, b: channels.batch_norm(x, w, b, EPS),
              lambda u: channels.batch_norm_backward(u, x, w, EPS), [x, w, b], [0, 1, 2], rng)
    assert channels.batch_norm.backward is channels.batch_norm_backward


def test_large_channel_kernels_run_parallel_and_match_serial(rng):
    x, w, b = _data(rng, LARGE, np.float32, channel_axis=0)
    u = rng.standard_normal(LARGE).astype(np.float32)
    for parallel, serial in zip(channels.batch_norm(x, w, b, EPS),
                                channels.batch_norm.serial(x, w, b, EPS)):
        np.testing.assert_array_equal(parallel, serial)  # one channel, one thread
    for parallel, serial in zip(channels.batch_norm_backward(u, x, w, EPS),
                                channels.batch_norm_backward.serial(u, x, w, EPS)):
        np.testing.assert_array_equal(parallel, serial)


class Defaults(CpuBackend):
    """CpuBackend's forward ops with FusedOps' defaults instead of the kernels."""

    batch_norm = FusedOps.batch_norm
    batch_norm_backward = FusedOps.batch_norm_backward


def _calls(backend, x, w, b, u):
    return [*backend.batch_norm(x, w, b, EPS), *backend.batch_norm_backward(u, x, w, EPS),
            backend.batch_norm(x, None, None, EPS)[0],
            backend.batch_norm_backward(u, x, None, EPS)[0], *backend.batch_norm_statistics(x)]


@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 2, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_backend_batch_norm_matches_the_forward_op_defaults(rng, shape, dtype):
    x, w, b = _data(rng, shape, dtype)
    u = rng.standard_normal(shape).astype(dtype)
    tol = {np.float16: {"rtol": 1e-2, "atol": 1e-2}}.get(dtype, TOL.get(dtype))
    got, want = _calls(CpuBackend(), x, w, b, u), _calls(Defaults(), x, w, b, u)
    for g, ref in zip(got, want, strict=True):
        assert g.dtype == ref.dtype == dtype and g.shape == ref.shape
        np.testing.assert_allclose(g, ref, **tol)
    np.testing.assert_allclose(got[0], batch_norm_ref(x, w, b)[0], **tol)


def test_threaded_backend_batch_norm_matches_cpu(rng):
    shape = (8, 4, 32, 40)  # above the parallel threshold
    x, w, b = _data(rng, shape, np.float32)
    u = rng.standard_normal(shape).astype(np.float32)
    for got, want in zip(_calls(ThreadedCpuBackend(num_threads=2), x, w, b, u),
                         _calls(CpuBackend(), x, w, b, u)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_backend_batch_norm_errors_name_the_op():
    with pytest.raises(KernelError, match=r"batch_norm: .*\(N, C\)"):
        CpuBackend().batch_norm(np.zeros(3), None, None, EPS)
    with pytest.raises(KernelError, match=r"batch_norm_statistics: .*\(N, C\)"):
        CpuBackend().batch_norm_statistics(np.zeros(3))
    with pytest.raises(KernelError, match=r"batch_norm_backward: .*floating"):
        CpuBackend().batch_norm_backward(np.zeros((2, 3)), np.zeros((2, 3), np.int64), None, EPS)


# ---------------------------------------------------------------- (N, C, S) plane kernels

PLANE_SHAPES = [(4, 3, 5, 6), (1, 2, 7, 1), (3, 5, 1, 1), (2, 3, 2, 3, 4)]


def _by_rows(x, w, b, u):
    """batch_norm and its backward through the row kernels, channels moved outermost
    (the way CpuBackend took for every input before the plane kernels)."""
    rows = np.ascontiguousarray(np.moveaxis(x, 1, 0)).reshape(x.shape[1], -1)
    urows = np.ascontiguousarray(np.moveaxis(u, 1, 0)).reshape(x.shape[1], -1)
    y, mean, var = channels.batch_norm.serial(rows, w, b, EPS)
    gx, gw, gb = channels.batch_norm_backward.serial(urows, rows, w, EPS)
    back = (x.shape[1], x.shape[0], *x.shape[2:])
    return [np.moveaxis(y.reshape(back), 0, 1), mean, var,
            np.moveaxis(gx.reshape(back), 0, 1), gw, gb]


@pytest.mark.parametrize("shape", PLANE_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_plane_kernels_match_the_row_kernels_and_numpy(rng, shape, dtype):
    x, w, b = _data(rng, shape, dtype)
    u = rng.standard_normal(shape).astype(dtype)
    x3, u3 = x.reshape(shape[0], shape[1], -1), u.reshape(shape[0], shape[1], -1)
    got = [*planes.batch_norm(x3, w, b, EPS), *planes.batch_norm_backward(u3, x3, w, EPS)]
    want = _by_rows(x, w, b, u)
    for g, ref in zip(got, want, strict=True):
        assert g.dtype == dtype
        np.testing.assert_allclose(g.reshape(ref.shape), ref, **TOL[dtype])
    np.testing.assert_allclose(got[0].reshape(shape), batch_norm_ref(x, w, b)[0], **TOL[dtype])


def test_plane_backward_is_the_vjp_of_the_plane_forward(rng):
    x, w, b = _data(rng, (3, 2, 5), np.float64)
    vjp_check(lambda x, w, b: planes.batch_norm(x, w, b, EPS)[0],
              lambda u: planes.batch_norm_backward(u, x, w, EPS), [x, w, b], [0, 1, 2], rng)


def test_parallel_plane_kernels_match_serial_bit_for_bit(rng):
    x, w, b = _data(rng, (8, 5, 33, 7), np.float32)
    u = rng.standard_normal(x.shape).astype(np.float32)
    x3, u3 = x.reshape(8, 5, -1), u.reshape(8, 5, -1)
    for parallel, serial in zip(
            [*planes.batch_norm(x3, w, b, EPS, True),
             *planes.batch_norm_backward(u3, x3, w, EPS, True)],
            [*planes.batch_norm(x3, w, b, EPS), *planes.batch_norm_backward(u3, x3, w, EPS)]):
        np.testing.assert_array_equal(parallel, serial)


def test_plane_kernels_in_parts_give_the_one_calls_results_bit_for_bit(rng):
    # `over` cuts the channels into parts (the backend passes split.over_parts): uneven
    # ones here, each channel's results computed in exactly one of them.
    x, w, b = _data(rng, (4, 7, 5, 3), np.float32)
    u = rng.standard_normal(x.shape).astype(np.float32)
    x3, u3 = x.reshape(4, 7, -1), u.reshape(4, 7, -1)
    cuts = []

    def over(n, run):
        cuts.append(n)
        return [run(0, 1), run(1, 5), run(5, n)]

    def all_of(over):
        return [*planes.batch_norm(x3, w, b, EPS, over=over),
                *planes.batch_norm(x3, w, b, EPS, relu=True, over=over),
                *planes.batch_norm_statistics(x3, over=over),
                *planes.batch_norm_backward(u3, x3, w, EPS, over=over)]

    whole, in_parts = all_of(None), all_of(over)
    assert cuts == [7] * 4
    for one, parts in zip(whole, in_parts, strict=True):
        np.testing.assert_array_equal(parts, one)


@pytest.mark.parametrize("shape", PLANE_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_plane_statistics_are_the_forwards_own_bit_for_bit_serial_or_parallel(rng, shape,
                                                                              dtype):
    # What the running statistics are updated with: the mean and biased variance the
    # forward normalized with, not another rounding of them.
    x, w, b = _data(rng, shape, dtype)
    x3 = x.reshape(shape[0], shape[1], -1)
    _, mean, var = planes.batch_norm(x3, w, b, EPS)
    for parallel in (False, True):
        got = planes.batch_norm_statistics(x3, parallel)
        np.testing.assert_array_equal(got[0], mean)
        np.testing.assert_array_equal(got[1], var)
    np.testing.assert_allclose(mean, batch_norm_ref(x, w, b)[1], **TOL[dtype])
    np.testing.assert_allclose(var, batch_norm_ref(x, w, b)[2], **TOL[dtype])


def test_backend_batch_norm_takes_planes_for_spatial_inputs_and_strided_ones(rng, monkeypatch):
    x, w, b = _data(rng, (3, 4, 6, 5), np.float32)
    u = rng.standard_normal(x.shape).astype(np.float32)
    taken = []
    for name in ("batch_norm", "batch_norm_backward"):
        original = getattr(planes, name)
        monkeypatch.setattr(planes, name, lambda *a, _f=original: (taken.append(1), _f(*a))[1])
    strided = np.asfortranarray(x)  # a layout the planes' copy makes C-contiguous
    w_strided, b_strided = np.repeat(w, 2)[::2], np.repeat(b, 2)[::2]
    got = _calls(CpuBackend(), strided, w_strided, b_strided, np.broadcast_to(u, u.shape))
    assert len(taken) == 4
    want = _calls(Defaults(), x, w, b, u)
    for g, ref in zip(got, want, strict=True):
        assert g.shape == ref.shape and g.flags.c_contiguous
        np.testing.assert_allclose(g, ref, **TOL[np.float32])
    _calls(CpuBackend(), x[:, :, 0, 0], w, b, u[:, :, 0, 0])  # (N, C): the row kernels
    assert len(taken) == 4


@pytest.mark.parametrize("shape", [(5, 3), (4, 3, 5, 6), (2, 3, 2, 3, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("backend", [CpuBackend(), ThreadedCpuBackend(num_threads=2),
                                     Defaults()], ids=["cpu", "threaded", "defaults"])
def test_batch_norm_with_relu_is_relu_of_batch_norm_bit_for_bit(rng, shape, dtype, backend):
    """relu=True (a training plan's batch norm + relu step) gives relu's result of the
    same batch norm, bit for bit, NaN staying NaN and -0 becoming 0 as relu's do; into
    `out` when given."""
    x, w, b = _data(rng, shape, dtype)
    x[:, 1] = np.nan  # a channel of NaN: its statistics and every output are NaN
    b[2] = 50.0  # a channel relu leaves as it is
    plain, mean, var = backend.batch_norm(x, w, b, EPS)
    want = backend.relu(plain)
    got, got_mean, got_var = backend.batch_norm(x, w, b, EPS, relu=True)
    np.testing.assert_array_equal(got, want)
    assert not np.signbit(got[~np.isnan(got)]).any() and np.isnan(got[:, 1]).all()
    np.testing.assert_array_equal(got_mean, mean)
    np.testing.assert_array_equal(got_var, var)
    if isinstance(backend, CpuBackend) and not isinstance(backend, Defaults):
        out = np.full(shape, 7.0, dtype)
        into = backend.batch_norm(x, w, b, EPS, relu=True, out=out)[0]
        assert into is out
        np.testing.assert_array_equal(out, want)


def test_batch_norm_with_relu_matches_pytorch(rng):
    torch = pytest.importorskip("torch")
    x, w, b = _data(rng, (6, 4, 3, 5), np.float64)
    got = CpuBackend().batch_norm(x, w, b, EPS, relu=True)[0]
    want = torch.relu(torch.nn.functional.batch_norm(
        torch.from_numpy(x), None, None, torch.from_numpy(w), torch.from_numpy(b),
        training=True, eps=EPS)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


def test_batch_norm_refuses_an_out_it_cannot_write():
    x = np.ones((2, 3, 4), np.float32)
    for out in (np.empty((2, 3, 5), np.float32), np.empty((2, 3, 4), np.float64),
                np.empty((4, 3, 2), np.float32).T):
        with pytest.raises(KernelError, match=r"batch_norm: .*out must be C-contiguous"):
            CpuBackend().batch_norm(x, None, None, EPS, out=out)
        with pytest.raises(KernelError,
                           match=r"batch_norm_backward: .*out must be C-contiguous"):
            CpuBackend().batch_norm_backward(x, x, None, EPS, out=out)


@pytest.mark.parametrize("shape", [(5, 3), (4, 3, 5, 6)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_batch_norm_backward_writes_grad_x_into_out(rng, shape, dtype):
    """A plan's cotangent buffer: grad_x written there, bit for bit the fresh array's."""
    x, w, _ = _data(rng, shape, dtype)
    u = rng.standard_normal(shape).astype(dtype)
    for backend in (CpuBackend(), ThreadedCpuBackend(num_threads=2)):
        want = backend.batch_norm_backward(u, x, w, EPS)
        out = np.full(shape, 7.0, dtype)
        got = backend.batch_norm_backward(u, x, w, EPS, out=out)
        assert got[0] is out
        for g, ref in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, ref)
