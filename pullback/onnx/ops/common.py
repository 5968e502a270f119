"""Helpers the converters share: shapes and dtypes of values, axes, legacy broadcasting,
N-D padding composed of concatenation and slicing."""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import ops
from ..errors import OnnxImportError
from ..registry import NodeView


def shape(x: Any) -> tuple:
    return tuple(x.shape)


def dtype(x: Any) -> np.dtype:
    return np.dtype(x.dtype)


def axis_of(node: NodeView, axis: int, ndim: int, what: str = "axis") -> int:
    """A possibly negative axis as a non-negative one, or an error naming the node."""
    if not -ndim <= axis < max(ndim, 1):
        raise OnnxImportError(f"{what} {axis} is out of range for {ndim} dimensions")
    return axis % ndim if ndim else 0


def constant(value: Any, like: Any) -> np.ndarray:
    """A scalar constant in `like`'s dtype (so f32 stays f32)."""
    return np.asarray(value, dtype=dtype(like))


def legacy_broadcast(node: NodeView, a: Any, b: Any) -> Any:
    """Before opset 7, binary ops broadcast only when `broadcast=1`, and then `b` aligns
    with `a` starting at `axis` (or at the trailing dimensions without `axis`)."""
    if node.since >= 7:
        return b
    if not node.attr("broadcast", 0):
        if shape(a) != shape(b):
            raise OnnxImportError(f"shapes {shape(a)} and {shape(b)} differ and the node does "
                                  "not set broadcast=1")
        return b
    ndim_a, sb = len(shape(a)), shape(b)
    if "axis" not in node.attrs:
        if len(sb) > ndim_a:
            raise OnnxImportError(f"{sb} has more dimensions than {shape(a)}")
        return b
    axis = axis_of(node, node.attr("axis"), ndim_a)
    if axis + len(sb) > ndim_a:
        raise OnnxImportError(f"{sb} does not fit {shape(a)} from axis {axis}")
    return ops.reshape(b, (1,) * axis + sb + (1,) * (ndim_a - axis - len(sb)))


def broadcast_shape(*shapes: tuple) -> tuple:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise OnnxImportError(f"shapes {', '.join(str(s) for s in shapes)} cannot be "
                              "broadcast together") from None


def pad_nd(x: Any, begins: list[int], ends: list[int], mode: str = "constant",
           value: Any = 0.0) -> Any:
    """Pad (or crop, where negative) every axis of x: "constant", "reflect" or "edge",
    composed of slicing and concatenation so it stays differentiable."""
    sx = shape(x)
    crop = tuple(slice(max(-b, 0), d - max(-e, 0)) for b, e, d in zip(begins, ends, sx))
    if any(b < 0 or e < 0 for b, e in zip(begins, ends)):
        x = ops.getitem(x, crop)
    for axis, (b, e) in enumerate(zip(begins, ends)):
        b, e = max(b, 0), max(e, 0)
        if b == 0 and e == 0:
            continue
        parts = []
        if b:
            parts.append(_border(x, axis, b, mode, value, before=True))
        parts.append(x)
        if e:
            parts.append(_border(x, axis, e, mode, value, before=False))
        x = ops.concatenate(parts, axis)
    return x


def _border(x: Any, axis: int, width: int, mode: str, value: Any, before: bool) -> Any:
    sx = shape(x)
    size = sx[axis]
    lead = (slice(None),) * axis
    if mode == "constant":
        block = sx[:axis] + (width,) + sx[axis + 1:]
        # A broadcast view, not a filled array: the concatenation is the one allocation.
        return ops.broadcast_to(np.asarray(value, dtype=dtype(x)), block)
    if size == 0:
        raise OnnxImportError(f"cannot pad an empty axis {axis} in {mode} mode")
    if mode == "edge":
        edge = ops.getitem(x, lead + (slice(0, 1) if before else slice(size - 1, size),))
        return ops.broadcast_to(edge, sx[:axis] + (width,) + sx[axis + 1:])
    if mode == "reflect":
        if width >= size:
            raise OnnxImportError(f"reflect padding of {width} needs an axis longer than "
                                  f"{width}, but axis {axis} has {size}")
        # The mirror image excludes the edge element itself: x[w], ..., x[1] before.
        stop = size - 2 - width
        index = slice(width, 0, -1) if before else slice(size - 2, stop if stop >= 0 else None, -1)
        return ops.getitem(x, lead + (index,))
    raise OnnxImportError(f"pad mode {mode!r} is not implemented (constant, reflect, edge are)")


def same_pads(auto_pad: str, sizes: tuple, kernel: tuple, strides: tuple,
              dilations: tuple) -> list[int]:
    """ONNX pads (all begins, then all ends) for auto_pad SAME_UPPER / SAME_LOWER."""
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def window_pads(node: NodeView, sizes: tuple, kernel: tuple, strides: tuple,
                dilations: tuple) -> list[int]:
    """The pads a conv or pool node asks for, from `pads` or `auto_pad`."""
    auto_pad = node.attr("auto_pad", "NOTSET")
    nd = len(kernel)
    if auto_pad in ("NOTSET", ""):
        pads = list(node.attr("pads", [0] * (2 * nd)))
        if len(pads) != 2 * nd:
            raise OnnxImportError(f"pads {pads} must have {2 * nd} entries")
        return pads
    if auto_pad == "VALID":
        return [0] * (2 * nd)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return same_pads(auto_pad, sizes, kernel, strides, dilations)
    raise OnnxImportError(f"auto_pad {auto_pad!r} is not one of NOTSET, VALID, SAME_UPPER, "
                          "SAME_LOWER")
