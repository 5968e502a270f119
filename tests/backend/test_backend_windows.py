"""conv2d, unfold2d/fold2d and pooling against naive per-pixel loops."""

from __future__ import annotations

import numpy as np
import pytest

FLOATS = [np.float32, np.float64]
TOL = {np.float32: {"rtol": 1e-5, "atol": 1e-5}, np.float64: {"rtol": 1e-12, "atol": 1e-12}}


def naive_windows(x, kernel, stride, padding, pad_value=0.0):
    """Yield (oh, ow, window) for every output pixel, padding by hand."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    n, c, h, w = x.shape
    padded = np.full((n, c, h + 2 * ph, w + 2 * pw), pad_value, dtype=np.float64)
    padded[:, :, ph:ph + h, pw:pw + w] = x
    out_h = (h + 2 * ph - kh) // sh + 1
    out_w = (w + 2 * pw - kw) // sw + 1
    for i in range(out_h):
        for j in range(out_w):
            yield i, j, padded[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]


def naive_conv2d(x, w, stride, padding):
    kernel = w.shape[2:]
    cells = list(naive_windows(x, kernel, stride, padding))
    out_h, out_w = cells[-1][0] + 1, cells[-1][1] + 1
    out = np.zeros((x.shape[0], w.shape[0], out_h, out_w))
    for i, j, window in cells:
        for o in range(w.shape[0]):
            out[:, o, i, j] = (window * w[o].astype(np.float64)).sum(axis=(1, 2, 3))
    return out


def naive_pool(x, kernel, stride, padding, reduce, pad_value):
    cells = list(naive_windows(x, kernel, stride, padding, pad_value))
    out = np.zeros((*x.shape[:2], cells[-1][0] + 1, cells[-1][1] + 1))
    for i, j, window in cells:
        out[:, :, i, j] = reduce(window.reshape(*x.shape[:2], -1), axis=-1)
    return out


CONV_CASES = [
    # (N, C, H, W), (O, kh, kw), stride, padding
    ((2, 3, 7, 6), (4, 3, 3), (1, 1), (0, 0)),
    ((2, 3, 7, 6), (4, 3, 2), (2, 1), (1, 2)),
    ((1, 2, 5, 5), (3, 5, 5), (1, 1), (2, 2)),
    ((2, 1, 8, 8), (2, 1, 1), (3, 3), (0, 0)),
    ((1, 2, 6, 5), (2, 2, 3), (2, 3), (1, 0)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("x_shape", "w_shape", "stride", "padding"), CONV_CASES)
def test_conv2d_matches_naive_loops(cpu, rng, x_shape, w_shape, stride, padding, dtype):
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal((w_shape[0], x_shape[1], *w_shape[1:])).astype(dtype)
    out = cpu.conv2d(x, w, stride, padding)
    assert out.dtype == dtype and out.flags.c_contiguous
    np.testing.assert_allclose(out, naive_conv2d(x, w, stride, padding), **TOL[dtype])


@pytest.mark.parametrize(("x_shape", "w_shape", "stride", "padding"), CONV_CASES)
def test_unfold2d_lists_every_window(cpu, rng, x_shape, w_shape, stride, padding):
    x = rng.standard_normal(x_shape)
    kernel = w_shape[1:]
    cols = cpu.unfold2d(x, kernel, stride, padding, pad_value=-5.0)
    cells = list(naive_windows(x, kernel, stride, padding, pad_value=-5.0))
    assert cols.shape == (*x_shape[:2], *kernel, cells[-1][0] + 1, cells[-1][1] + 1)
    for i, j, window in cells:
        np.testing.assert_array_equal(cols[..., i, j], window)


@pytest.mark.parametrize(("x_shape", "w_shape", "stride", "padding"), CONV_CASES)
def test_fold2d_is_adjoint_of_unfold2d(cpu, rng, x_shape, w_shape, stride, padding):
    x = rng.standard_normal(x_shape)
    kernel = w_shape[1:]
    cols = rng.standard_normal(cpu.unfold2d(x, kernel, stride, padding).shape)
    folded = cpu.fold2d(cols, x_shape, kernel, stride, padding)
    assert folded.shape == x_shape
    lhs = np.sum(cpu.unfold2d(x, kernel, stride, padding) * cols)
    np.testing.assert_allclose(lhs, np.sum(x * folded), rtol=1e-12)


POOL_CASES = [
    # (N, C, H, W), kernel, stride, padding
    ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0)),
    ((2, 2, 7, 9), (3, 3), (2, 2), (1, 1)),
    ((1, 2, 6, 7), (3, 2), (1, 2), (1, 0)),
    ((1, 1, 5, 5), (2, 2), (1, 1), (0, 0)),
    ((1, 2, 9, 9), (3, 3), (3, 3), (0, 0)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("x_shape", "kernel", "stride", "padding"), POOL_CASES)
def test_max_pool2d_matches_naive_loops(cpu, rng, x_shape, kernel, stride, padding, dtype):
    x = rng.standard_normal(x_shape).astype(dtype)
    out = cpu.max_pool2d(x, kernel, stride, padding)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, naive_pool(x, kernel, stride, padding, np.max, -np.inf))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("x_shape", "kernel", "stride", "padding"), POOL_CASES)
def test_avg_pool2d_counts_padding(cpu, rng, x_shape, kernel, stride, padding, dtype):
    x = rng.standard_normal(x_shape).astype(dtype)
    out = cpu.avg_pool2d(x, kernel, stride, padding)
    assert out.dtype == dtype
    expected = naive_pool(x, kernel, stride, padding, np.mean, 0.0)
    np.testing.assert_allclose(out, expected, **TOL[dtype])


def test_max_pool2d_padding_never_wins(cpu):
    x = -np.ones((1, 1, 2, 2), dtype=np.float32)
    assert cpu.max_pool2d(x, (2, 2), (1, 1), (1, 1)).tolist() == [[[[-1.0] * 3] * 3]]


def test_pool_output_size_floors(cpu):
    x = np.zeros((1, 1, 7, 6), dtype=np.float32)
    assert cpu.max_pool2d(x, (2, 2), (2, 2), (0, 0)).shape == (1, 1, 3, 3)
    assert cpu.avg_pool2d(x, (3, 3), (2, 2), (1, 1)).shape == (1, 1, 4, 3)
