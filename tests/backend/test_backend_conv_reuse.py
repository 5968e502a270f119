"""What pullback.backend.conv keeps from one call to the next, held to computing afresh:
the windows a small-map forward leaves for the weight gradient (taken only when the
input is bit for bit the forward's), the bitwise transposed comparison that decides it,
and the validated windows and geometry arrays kept per signature (a call that is
invalid still raises after a valid one of the same shapes)."""

from __future__ import annotations

import numpy as np
import pytest

from pullback.backend import conv as backend_conv
from pullback.errors import KernelError
from pullback.kernels import conv as kernels

GEOMETRY = ((1, 1), (0, 0))


def _operands(dtype: type) -> tuple:
    # A digits CNN's second layer in small: 6x6 maps, batch innermost, one chunk.
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 4, 6, 6)).astype(dtype)
    w = rng.standard_normal((6, 4, 3, 3)).astype(dtype)
    upstream = rng.standard_normal((5, 6, 4, 4)).astype(dtype)
    return x, w, upstream


def _afresh(upstream: np.ndarray, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The weight gradient with nothing kept from an earlier call."""
    backend_conv.scratch("windows", 1, x.dtype)  # forgets the kept windows
    return backend_conv.conv2d_weight_backward(upstream, x, w.shape, *GEOMETRY)


def _same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_weight_gradient_takes_the_forwards_windows(monkeypatch, dtype):
    x, w, upstream = _operands(dtype)
    expected = _afresh(upstream, x, w)
    backend_conv.conv2d(x, w, *GEOMETRY)
    unfolds = []
    monkeypatch.setattr(kernels, "unfold", lambda *a: unfolds.append(a))  # must not run
    _same_bits(backend_conv.conv2d_weight_backward(upstream, x, w.shape, *GEOMETRY), expected)
    assert not unfolds


@pytest.mark.parametrize("change", ["in place", "other array"])
def test_weight_gradient_never_takes_windows_of_another_input(change):
    x, w, upstream = _operands(np.float32)
    backend_conv.conv2d(x, w, *GEOMETRY)
    if change == "in place":
        x[4, 3, 5, 5] += 1.0  # after the forward
    else:
        x = x[::-1].copy()
    got = backend_conv.conv2d_weight_backward(upstream, x, w.shape, *GEOMETRY)
    _same_bits(got, _afresh(upstream, x, w))


def test_input_gradient_between_forward_and_weight_gradient():
    # The input gradient's products take the scratch the windows were kept in.
    x, w, upstream = _operands(np.float64)
    backend_conv.conv2d(x, w, *GEOMETRY)
    backend_conv.conv2d_input_backward(upstream, w, x.shape, *GEOMETRY)
    got = backend_conv.conv2d_weight_backward(upstream, x, w.shape, *GEOMETRY)
    _same_bits(got, _afresh(upstream, x, w))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(9, 17), (16, 8), (3, 5), (0, 4)])
def test_transposed_equal_compares_bits(dtype, shape):
    src = np.random.default_rng(5).standard_normal(shape).astype(dtype)
    if src.size:
        src[0, -1] = np.nan
        src[-1, 0] = -0.0
    assert kernels.transposed_equal(src, np.ascontiguousarray(src.T))  # the same NaN too
    for i, j in ([(0, 0), (shape[0] - 1, shape[1] - 1), (shape[0] // 2, 0)]
                 if src.size else []):
        for value in (1.5, np.nan):
            other = src.copy()
            other[i, j] = value if other[i, j] != value else 2.5
            assert not kernels.transposed_equal(other, np.ascontiguousarray(src.T))
    if src.size:
        other = src.copy()
        other[-1, 0] = 0.0
        assert not kernels.transposed_equal(other, np.ascontiguousarray(src.T))


def test_invalid_calls_raise_after_valid_ones_of_the_same_shapes():
    x, w, upstream = _operands(np.float32)
    backend_conv.conv2d(x, w, *GEOMETRY, groups=1)
    backend_conv.conv2d_input_backward(upstream, w, x.shape, *GEOMETRY, groups=1)
    with pytest.raises(KernelError, match="groups must be a positive int"):
        backend_conv.conv2d(x, w, *GEOMETRY, groups=True)
    with pytest.raises(KernelError, match="groups must be a positive int"):
        backend_conv.conv2d_input_backward(upstream, w, x.shape, *GEOMETRY, groups=True)
    with pytest.raises(KernelError, match="expected an upstream of shape"):
        backend_conv.conv2d_weight_backward(upstream[:, :3], x, w.shape, *GEOMETRY)
    # Lists for pairs are not kept, and still validated.
    got = backend_conv.conv2d(x, w, [1, 1], [0, 0])
    np.testing.assert_array_equal(got, backend_conv.conv2d(x, w, *GEOMETRY))
    with pytest.raises(KernelError, match="stride"):
        backend_conv.conv2d(x, w, [0, 1], [0, 0])
