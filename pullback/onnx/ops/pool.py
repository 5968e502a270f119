"""MaxPool and AveragePool, 1-D to 3-D, with pads, dilations and ceil_mode.

2-D (and 1-D, as 2-D over a height of 1) pools without dilation use pullback's
max_pool2d / avg_pool2d after an explicit pad; anything else is composed: a
running maximum or sum over the kernel's offsets, each a strided slice of the
padded input. AveragePool's default divides by the number of real (not
padding) elements in each window: a count known from shapes alone.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ... import ops
from ...tensor import Tensor
from ..errors import OnnxImportError
from ..registry import NodeView, converter
from .common import dtype, pad_nd, shape, window_pads

_POOL_ATTRS = ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides")


def _geometry(node: NodeView, x: Any) -> tuple:
    """kernel, strides, dilations, begin pads, end pads (ceil_mode's extra included),
    output sizes and the pads ONNX asked for."""
    sizes = shape(x)[2:]
    kernel = tuple(node.attr("kernel_shape"))
    nd = len(kernel)
    if len(sizes) != nd or nd not in (1, 2, 3):
        raise OnnxImportError(f"kernel_shape {kernel} does not fit an input of shape "
                              f"{shape(x)} (1 to 3 spatial dimensions)")
    strides = tuple(node.attr("strides", [1] * nd))
    dilations = tuple(node.attr("dilations", [1] * nd))
    if len(strides) != nd or len(dilations) != nd or min(strides + dilations) < 1:
        raise OnnxImportError(f"strides {strides} and dilations {dilations} must be {nd} "
                              "positive integers")
    pads = window_pads(node, sizes, kernel, strides, dilations)
    begins, ends = list(pads[:nd]), list(pads[nd:])
    ceil = bool(node.attr("ceil_mode", 0))
    outs, extra = [], []
    for size, k, s, d, b, e in zip(sizes, kernel, strides, dilations, begins, ends):
        span = size + b + e - (k - 1) * d - 1
        if span < 0:
            raise OnnxImportError(f"kernel {kernel} (dilations {dilations}) exceeds the padded "
                                  f"input {tuple(sizes)}")
        out = (-(-span // s) if ceil else span // s) + 1
        if ceil and (out - 1) * s >= size + b:
            out -= 1  # a window may not start in the end padding (as PyTorch and ONNX's reference)
        outs.append(out)
        extra.append(max((out - 1) * s + (k - 1) * d + 1 - (size + b + e), 0))
    return kernel, strides, dilations, begins, ends, extra, outs


def _offset_windows(xp: Any, kernel: tuple, strides: tuple, dilations: tuple,
                    outs: list[int]) -> Iterator[Tensor]:
    """Yield, per kernel offset, the strided slice of xp that offset reads."""
    for offset in itertools.product(*(range(k) for k in kernel)):
        index = [slice(None), slice(None)]
        for o, s, d, n in zip(offset, strides, dilations, outs):
            index.append(slice(o * d, o * d + s * (n - 1) + 1, s))
        yield ops.getitem(xp, tuple(index))


def _native(pool: Any, x: Any, kernel: tuple, strides: tuple, begins: list, ends: list,
            extra: list, pad_value: float) -> Any:
    """pullback's 2-D pool (1-D as a height of 1), padding itself when pads are symmetric."""
    if len(kernel) == 1:
        sx = shape(x)
        x = ops.reshape(x, (sx[0], sx[1], 1, sx[2]))
        kernel, strides = (1,) + kernel, (1,) + strides
        begins, ends, extra = [0] + begins, [0] + ends, [0] + extra
    if begins == ends and not any(extra) and all(2 * b <= k for b, k in zip(begins, kernel)):
        return pool(x, kernel, strides, tuple(begins))
    ends = [e + x_ for e, x_ in zip(ends, extra)]
    return pool(pad_nd(x, [0, 0] + begins, [0, 0] + ends, "constant", pad_value), kernel,
                strides, 0)


@converter("MaxPool", (1, 8, 10, 11, 12), _POOL_ATTRS + ("storage_order",))
def _max_pool(node: NodeView, x: Any) -> Any:
    if len([o for o in node.outputs if o]) > 1:
        raise OnnxImportError("the Indices output is not implemented")
    if dtype(x).kind != "f":
        raise OnnxImportError(f"MaxPool of {dtype(x)} is not implemented (floats are)")
    kernel, strides, dilations, begins, ends, extra, outs = _geometry(node, x)
    nd = len(kernel)
    if nd <= 2 and all(d == 1 for d in dilations):
        y = _native(ops.max_pool2d, x, kernel, strides, begins, ends, extra, -np.inf)
        return ops.reshape(y, shape(y)[:2] + (shape(y)[3],)) if nd == 1 else y
    xp = pad_nd(x, [0, 0] + begins, [0, 0] + [e + x_ for e, x_ in zip(ends, extra)], "constant",
                -np.inf)
    result = None
    for window in _offset_windows(xp, kernel, strides, dilations, outs):
        result = window if result is None else ops.maximum(result, window)
    return result


@converter("AveragePool", (1, 7, 10, 11, 19), _POOL_ATTRS + ("count_include_pad",))
def _average_pool(node: NodeView, x: Any) -> Any:
    if dtype(x).kind != "f":
        raise OnnxImportError(f"AveragePool of {dtype(x)} is not implemented (floats are)")
    kernel, strides, dilations, begins, ends, extra, outs = _geometry(node, x)
    nd = len(kernel)
    include_pad = bool(node.attr("count_include_pad", 0))
    if nd <= 2 and all(d == 1 for d in dilations):
        # avg_pool2d divides by the kernel's size: undo it, then divide by the real count.
        total = ops.mul(_native(ops.avg_pool2d, x, kernel, strides, begins, ends, extra, 0.0),
                        float(np.prod(kernel)))
        if nd == 1:
            total = ops.reshape(total, shape(total)[:2] + (shape(total)[3],))
    else:
        xp = pad_nd(x, [0, 0] + begins, [0, 0] + [e + x_ for e, x_ in zip(ends, extra)])
        # The windows summed one by one (a kernel has at least one offset).
        total = functools.reduce(ops.add, _offset_windows(xp, kernel, strides, dilations,
                                                          outs))
    counts = _window_counts(shape(x)[2:], kernel, strides, dilations, begins, ends, outs,
                            include_pad)
    return ops.mul(total, (1.0 / counts).astype(dtype(x)))


def _window_counts(sizes: tuple, kernel: tuple, strides: tuple, dilations: tuple,
                   begins: list, ends: list, outs: list, include_pad: bool) -> np.ndarray:
    """How many elements each window averages: the real ones, or with count_include_pad
    the pads too (never ceil_mode's extension past the end pads). Counted per output
    position in closed form: memory and time follow the output, not the pads or kernel."""
    counts: NDArray[np.float64] = np.ones((1,), dtype=np.float64)
    for size, k, s, d, b, e, n in zip(sizes, kernel, strides, dilations, begins, ends, outs):
        lo, hi = (0, size + b + e) if include_pad else (b, size + b)
        starts = np.arange(n, dtype=np.int64) * s
        # The offsets o < k whose element starts + o * d lies in [lo, hi).
        first = np.maximum(-((starts - lo) // d), 0)
        stop = np.minimum(-((starts - hi) // d), k)
        counts = np.multiply.outer(counts, np.maximum(stop - first, 0).astype(np.float64))
    counts = counts.reshape((1, 1) + tuple(outs))
    if (counts == 0).any():
        raise OnnxImportError("a window lies entirely in the padding (nothing to average)")
    return counts
