"""Sliding-window kernels on NumPy arrays: im2col/col2im, conv2d and pooling with
their backward passes. Loops run over kernel offsets (kh * kw), never over pixels;
every entry point validates its arguments and raises `KernelError` naming the op.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from pullback.backend.errors import KernelError

Pair = tuple[int, int]


def pair(op: str, operands: Sequence[Any], name: str, value: Any, least: int) -> Pair:
    """value as an (int, int) pair, each at least `least`, or a KernelError for op."""
    try:
        first, second = (int(v) for v in value)
    except (TypeError, ValueError):
        raise KernelError(op, operands, f"{name} must be a pair of ints, not {value!r}") from None
    if first < least or second < least:
        bound = "positive" if least else "non-negative"
        raise KernelError(op, operands, f"{name} {(first, second)} must be {bound}")
    return first, second


def check_windows(
    op: str, x: np.ndarray, kernel: Any, stride: Any, padding: Any,
    operands: Sequence[Any] | None = None,
) -> tuple[Pair, Pair, Pair, Pair]:
    """Validate a window op on x (N, C, H, W); return (kernel, stride, padding, (OH, OW))."""
    operands = [x] if operands is None else operands
    if x.ndim != 4:
        raise KernelError(op, operands, f"expected a 4-D (N, C, H, W) input, got {x.ndim}-D")
    kernel = pair(op, operands, "kernel", kernel, 1)
    stride = pair(op, operands, "stride", stride, 1)
    padding = pair(op, operands, "padding", padding, 0)
    padded = (x.shape[2] + 2 * padding[0], x.shape[3] + 2 * padding[1])
    if kernel[0] > padded[0] or kernel[1] > padded[1]:
        raise KernelError(
            op, operands,
            f"kernel {kernel[0]}x{kernel[1]} is larger than the padded input "
            f"{padded[0]}x{padded[1]}",
        )
    out_hw = ((padded[0] - kernel[0]) // stride[0] + 1, (padded[1] - kernel[1]) // stride[1] + 1)
    return kernel, stride, padding, out_hw


def check_float(op: str, operands: Sequence[Any]) -> None:
    for array in operands:
        if array.dtype.kind != "f":
            raise KernelError(op, operands, "expected a floating dtype")


def pad(x: np.ndarray, padding: Pair, value: float) -> np.ndarray:
    """x padded on its last two axes; x itself when there is no padding (internal use)."""
    ph, pw = padding
    if ph == 0 and pw == 0:
        return x
    h, w = x.shape[-2:]
    out = np.empty((*x.shape[:-2], h + 2 * ph, w + 2 * pw), dtype=x.dtype)
    # Fill only the border, then copy the interior once.
    out[..., :ph, :] = value
    out[..., ph + h:, :] = value
    out[..., ph:ph + h, :pw] = value
    out[..., ph:ph + h, pw + w:] = value
    out[..., ph:ph + h, pw:pw + w] = x
    return out


def _offsets(kernel: Pair, stride: Pair, out_hw: Pair) -> Iterator[tuple[int, int, tuple]]:
    # For each kernel offset (i, j): the strided slice of the padded input it reads.
    (kh, kw), (sh, sw), (oh, ow) = kernel, stride, out_hw
    for i in range(kh):
        for j in range(kw):
            rows = slice(i, i + sh * (oh - 1) + 1, sh)
            yield i, j, (..., rows, slice(j, j + sw * (ow - 1) + 1, sw))


def unfold(
    x: np.ndarray, kernel: Pair, stride: Pair, padding: Pair, out_hw: Pair,
    pad_value: float = 0.0, channels_outer: bool = False,
) -> np.ndarray:
    """Windows of x as (N, C, kh, kw, OH, OW), or as (C, kh, kw, N, OH, OW) when
    channels_outer, the layout one GEMM over the whole batch wants."""
    xp = pad(x, padding, pad_value)
    n, c = x.shape[:2]
    if channels_outer:
        buf = np.empty((c, *kernel, n, *out_hw), dtype=x.dtype)
        view = buf.transpose(3, 0, 1, 2, 4, 5)
    else:
        buf = view = np.empty((n, c, *kernel, *out_hw), dtype=x.dtype)
    for i, j, window in _offsets(kernel, stride, out_hw):
        view[:, :, i, j] = xp[window]
    return buf


def fold(
    cols: np.ndarray, input_shape: Sequence[int], kernel: Pair, stride: Pair, padding: Pair
) -> np.ndarray:
    """The adjoint of unfold: add windows (N, C, kh, kw, OH, OW), any strides, into a
    zero (N, C, H, W) array, cropping the padding."""
    n, c, h, w = input_shape
    ph, pw = padding
    out = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=cols.dtype)
    for i, j, window in _offsets(kernel, stride, cols.shape[-2:]):
        out[window] += cols[:, :, i, j]
    if ph or pw:
        out = np.ascontiguousarray(out[:, :, ph:ph + h, pw:pw + w])
    return out


def check_conv(x: np.ndarray, w: np.ndarray, stride: Any, padding: Any) -> tuple:
    operands = [x, w]
    if x.ndim != 4 or w.ndim != 4:
        raise KernelError(
            "conv2d", operands, "expected 4-D input (N, C, H, W) and weight (O, C, kh, kw)"
        )
    check_float("conv2d", operands)
    if x.dtype != w.dtype:
        raise KernelError("conv2d", operands, "input and weight dtypes differ")
    if w.shape[1] != x.shape[1]:
        raise KernelError(
            "conv2d", operands,
            f"weight has {w.shape[1]} input channels but input has {x.shape[1]}",
        )
    return check_windows("conv2d", x, w.shape[2:], stride, padding, operands)


def conv2d(x: np.ndarray, w: np.ndarray, stride: Pair, padding: Pair) -> np.ndarray:
    """x (N, C, H, W) cross-correlated with w (O, C, kh, kw): im2col and one GEMM."""
    kernel, stride, padding, out_hw = check_conv(x, w, stride, padding)
    n, o = x.shape[0], w.shape[0]
    cols = unfold(x, kernel, stride, padding, out_hw, channels_outer=True)
    out = w.reshape(o, -1) @ cols.reshape(-1, n * out_hw[0] * out_hw[1])
    return np.ascontiguousarray(out.reshape(o, n, *out_hw).transpose(1, 0, 2, 3))


def conv2d_input_backward(
    upstream: np.ndarray, w: np.ndarray, input_shape: Sequence[int], stride: Pair, padding: Pair
) -> np.ndarray:
    """Gradient wrt x: w^T @ upstream as windows, folded back."""
    n, o, oh, ow = upstream.shape
    _, c, kh, kw = w.shape
    up = upstream.transpose(1, 0, 2, 3).reshape(o, n * oh * ow)
    cols = (w.reshape(o, -1).T @ up).reshape(c, kh, kw, n, oh, ow)
    return fold(cols.transpose(3, 0, 1, 2, 4, 5), input_shape, (kh, kw), stride, padding)


def conv2d_weight_backward(
    upstream: np.ndarray, x: np.ndarray, weight_shape: Sequence[int], stride: Pair, padding: Pair
) -> np.ndarray:
    """Gradient wrt w: upstream @ windows^T over the whole batch in one GEMM."""
    n, o, oh, ow = upstream.shape
    kernel = (weight_shape[2], weight_shape[3])
    cols = unfold(x, kernel, stride, padding, (oh, ow), channels_outer=True)
    up = upstream.transpose(1, 0, 2, 3).reshape(o, n * oh * ow)
    return (up @ cols.reshape(-1, n * oh * ow).T).reshape(weight_shape)


def check_pool(op: str, x: np.ndarray, kernel: Any, stride: Any, padding: Any) -> tuple:
    check_float(op, [x])
    kernel, stride, padding, out_hw = check_windows(op, x, kernel, stride, padding)
    if 2 * padding[0] > kernel[0] or 2 * padding[1] > kernel[1]:
        raise KernelError(op, [x], f"padding {padding} is more than half the kernel {kernel}")
    return kernel, stride, padding, out_hw


def max_pool2d(x: np.ndarray, kernel: Pair, stride: Pair, padding: Pair) -> np.ndarray:
    """Running maximum over kernel offsets; padding reads as -inf."""
    kernel, stride, padding, out_hw = check_pool("max_pool2d", x, kernel, stride, padding)
    xp = pad(x, padding, -np.inf)
    out = None
    for _, _, window in _offsets(kernel, stride, out_hw):
        out = xp[window].copy() if out is None else np.maximum(out, xp[window], out=out)
    return out


def avg_pool2d(x: np.ndarray, kernel: Pair, stride: Pair, padding: Pair) -> np.ndarray:
    """Running sum over kernel offsets divided by kh * kw (count_include_pad=True)."""
    kernel, stride, padding, out_hw = check_pool("avg_pool2d", x, kernel, stride, padding)
    xp = pad(x, padding, 0.0)
    out = None
    for _, _, window in _offsets(kernel, stride, out_hw):
        out = xp[window].copy() if out is None else np.add(out, xp[window], out=out)
    out *= 1.0 / (kernel[0] * kernel[1])
    return out


def max_pool2d_backward(
    upstream: np.ndarray, x: np.ndarray, y: np.ndarray, kernel: Pair, stride: Pair, padding: Pair
) -> np.ndarray:
    """upstream to the first maximum of each window in row-major order, as PyTorch."""
    h, w = x.shape[2:]
    ph, pw = padding
    xp = pad(x, padding, -np.inf)
    grad = np.zeros(xp.shape, dtype=upstream.dtype)
    taken = np.zeros(y.shape, dtype=bool)
    hit = np.empty(y.shape, dtype=bool)
    share = np.empty(y.shape, dtype=upstream.dtype)
    for _, _, window in _offsets(kernel, stride, y.shape[-2:]):
        np.equal(xp[window], y, out=hit)
        np.greater(hit, taken, out=hit)  # a max not taken by an earlier offset
        taken |= hit
        np.multiply(upstream, hit, out=share)
        grad[window] += share
    if ph or pw:
        grad = np.ascontiguousarray(grad[:, :, ph:ph + h, pw:pw + w])
    return grad


def avg_pool2d_backward(
    upstream: np.ndarray, input_shape: Sequence[int], kernel: Pair, stride: Pair, padding: Pair
) -> np.ndarray:
    """upstream / (kh kw) added into every position of its window."""
    n, c, h, w = input_shape
    ph, pw = padding
    share = upstream * (1.0 / (kernel[0] * kernel[1]))
    grad = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=upstream.dtype)
    for _, _, window in _offsets(kernel, stride, upstream.shape[-2:]):
        grad[window] += share
    if ph or pw:
        grad = np.ascontiguousarray(grad[:, :, ph:ph + h, pw:pw + w])
    return grad
