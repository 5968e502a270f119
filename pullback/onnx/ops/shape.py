"""Shape ONNX ops: reshaping, slicing, joining, padding, constants.

Their shape-like operands (a Reshape's shape, a Slice's starts, pads) must be
known when a plan is built; `node.static` says so, and a graph that computes
them from its inputs runs eagerly instead (see `model`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import ops
from ...tensor import Tensor
from ..errors import OnnxImportError
from ..registry import NodeView, converter
from .common import axis_of, broadcast_shape, dtype, pad_nd, shape


def _size(dims: tuple) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


@converter("Reshape", (5, 13, 14), ("allowzero",), static_inputs=(1,))
def _reshape(node: NodeView, x: Any, target: Any) -> Any:
    dims = node.static_ints(target, "shape")
    allowzero = node.attr("allowzero", 0)
    sx = shape(x)
    out = []
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= len(sx):
                raise OnnxImportError(f"shape {dims}: a 0 at position {i} copies a dimension "
                                      f"that {sx} does not have")
            out.append(sx[i])  # 0 copies the input's dimension
        else:
            out.append(d)
    if out.count(-1) > 1 or any(d < -1 for d in out):
        raise OnnxImportError(f"shape {dims} is not a valid target")
    if -1 in out:
        known = _size(tuple(d for d in out if d != -1))
        if known == 0 or _size(sx) % known:
            raise OnnxImportError(f"cannot reshape {sx} into {dims}")
        out[out.index(-1)] = _size(sx) // known
    if _size(tuple(out)) != _size(sx):
        raise OnnxImportError(f"cannot reshape {sx} ({_size(sx)} elements) into {tuple(out)}")
    return ops.reshape(x, tuple(out))


@converter("Flatten", (1, 9, 11, 13, 21), ("axis",))
def _flatten(node: NodeView, x: Any) -> Any:
    sx = shape(x)
    axis = node.attr("axis", 1)
    if not -len(sx) <= axis <= len(sx):
        raise OnnxImportError(f"axis {axis} is out of range for {len(sx)} dimensions")
    if axis < 0:
        axis += len(sx)
    return ops.reshape(x, (_size(sx[:axis]), _size(sx[axis:])))


@converter("Transpose", (1, 13, 21), ("perm",))
def _transpose(node: NodeView, x: Any) -> Any:
    ndim = len(shape(x))
    perm = node.attr("perm", list(reversed(range(ndim))))
    if sorted(perm) != list(range(ndim)):
        raise OnnxImportError(f"perm {perm} is not a permutation of {ndim} axes")
    return ops.transpose(x, tuple(perm))


def _axes(node: NodeView, axes_input: Any, ndim: int) -> list[int] | None:
    """Axes from the attribute (before opset 13) or the optional input (from 13)."""
    if node.since < 13:
        axes = node.attr("axes", None)
    else:
        axes = None if axes_input is None else node.static_ints(axes_input, "axes")
    if axes is None:
        return None
    normalized = [axis_of(node, a, ndim) for a in axes]
    if len(set(normalized)) != len(normalized):
        raise OnnxImportError(f"axes {axes} repeat an axis")
    return normalized


@converter("Squeeze", (1, 11, 13, 21), ("axes",), static_inputs=(1,))
def _squeeze(node: NodeView, x: Any, axes: Any = None) -> Any:
    sx = shape(x)
    chosen = _axes(node, axes, len(sx))
    if chosen is None:
        chosen = [i for i, d in enumerate(sx) if d == 1]
    for a in chosen:
        if sx[a] != 1:
            raise OnnxImportError(f"cannot squeeze axis {a} of size {sx[a]}")
    return ops.reshape(x, tuple(d for i, d in enumerate(sx) if i not in chosen))


@converter("Unsqueeze", (1, 11, 13, 21), ("axes",), static_inputs=(1,))
def _unsqueeze(node: NodeView, x: Any, axes: Any = None) -> Any:
    sx = shape(x)
    if node.since < 13:
        raw = node.attr("axes")
    else:
        if axes is None:
            raise OnnxImportError("the axes input is required")
        raw = node.static_ints(axes, "axes")
    ndim = len(sx) + len(raw)
    chosen = sorted(axis_of(node, a, ndim) for a in raw)
    if len(set(chosen)) != len(chosen):
        raise OnnxImportError(f"axes {raw} repeat an axis")
    out, rest = [], iter(sx)
    for i in range(ndim):
        out.append(1 if i in chosen else next(rest))
    return ops.reshape(x, tuple(out))


@converter("Concat", (4, 11, 13), ("axis",))
def _concat(node: NodeView, *xs: Any) -> Any:
    xs = tuple(x for x in xs if x is not None)
    if not xs:
        raise OnnxImportError("needs at least one input")
    axis = axis_of(node, node.attr("axis"), len(shape(xs[0])))
    if len({dtype(x) for x in xs}) > 1:
        raise OnnxImportError("inputs have different dtypes")
    if len(xs) == 1:
        return xs[0]
    return ops.concatenate(xs, axis)


def split_sizes(node: NodeView, length: int, parts: int, split: list[int] | None) -> list[int]:
    if split is None:
        if parts < 1 or length % parts:
            raise OnnxImportError(f"cannot split a dimension of {length} into {parts} equal "
                                  "parts")
        return [length // parts] * parts
    if sum(split) != length or any(s < 0 for s in split):
        raise OnnxImportError(f"split {split} does not add up to the dimension {length}")
    return split


def split_along(x: Any, axis: int, sizes: list[int]) -> tuple:
    pieces, start = [], 0
    lead = (slice(None),) * axis
    for s in sizes:
        pieces.append(ops.getitem(x, lead + (slice(start, start + s),)))
        start += s
    return tuple(pieces)


@converter("Split", (2, 11, 13), ("axis", "split"), static_inputs=(1,))
def _split(node: NodeView, x: Any, split: Any = None) -> tuple:
    sx = shape(x)
    axis = axis_of(node, node.attr("axis", 0), len(sx))
    if node.since < 13:
        sizes = node.attr("split", None)
    else:
        sizes = None if split is None else node.static_ints(split, "split")
    sizes = split_sizes(node, sx[axis], len(node.outputs), sizes)
    if len(sizes) != len(node.outputs):
        raise OnnxImportError(f"split {sizes} has {len(sizes)} parts for {len(node.outputs)} "
                              "outputs")
    return split_along(x, axis, sizes)


@converter("Slice", (1, 10, 11, 13), ("starts", "ends", "axes"),
           static_inputs=(1, 2, 3, 4))
def _slice(node: NodeView, x: Any, starts: Any = None, ends: Any = None, axes: Any = None,
           steps: Any = None) -> Any:
    sx = shape(x)
    if node.since < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes = node.attr("axes", list(range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = node.static_ints(starts, "starts")
        ends = node.static_ints(ends, "ends")
        axes = list(range(len(starts))) if axes is None else node.static_ints(axes, "axes")
        steps = [1] * len(starts) if steps is None else node.static_ints(steps, "steps")
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise OnnxImportError("starts, ends, axes and steps must have one length")
    index = [slice(None)] * len(sx)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        a = axis_of(node, axis, len(sx))
        if step == 0:
            raise OnnxImportError("a step of 0")
        # Python's slices clamp out-of-range bounds as ONNX does (INT_MAX means "to the end").
        index[a] = slice(start, end, step)
    return ops.getitem(x, tuple(index))


@converter("Gather", (1, 11, 13), ("axis",), static_inputs=(1,))
def _gather(node: NodeView, x: Any, indices: Any) -> Any:
    sx = shape(x)
    axis = axis_of(node, node.attr("axis", 0), len(sx))
    idx = node.static(indices, "indices")
    if idx.dtype.kind not in "iu":
        raise OnnxImportError(f"indices must be integers, not {idx.dtype}")
    if idx.size and (idx.min() < -sx[axis] or idx.max() >= sx[axis]):
        raise OnnxImportError(f"indices must lie in [{-sx[axis]}, {sx[axis] - 1}], the "
                              f"range of axis {axis}")
    return ops.getitem(x, (slice(None),) * axis + (idx.astype(np.int64),))


@converter("GatherElements", (11, 13), ("axis",))
def _gather_elements(node: NodeView, x: Any, indices: Any) -> Any:
    sx, si = shape(x), shape(indices)
    axis = axis_of(node, node.attr("axis", 0), len(sx))
    if len(si) != len(sx) or any(i > d for a, (i, d) in enumerate(zip(si, sx)) if a != axis):
        raise OnnxImportError(f"indices {si} must have the rank of data {sx} and no larger a "
                              f"size on any axis but {axis}")
    if any(i != d for a, (i, d) in enumerate(zip(si, sx)) if a != axis):
        # ONNX reads only the leading part of data on the other axes; NumPy's rule would
        # broadcast them instead.
        x = ops.getitem(x, tuple(slice(None) if a == axis else slice(0, i)
                                 for a, i in enumerate(si)))
    return ops.take_along_axis(x, indices, axis)


@converter("Expand", (8, 13), static_inputs=(1,))
def _expand(node: NodeView, x: Any, target: Any) -> Any:
    dims = tuple(node.static_ints(target, "shape"))
    out = broadcast_shape(shape(x), dims)  # bidirectional: a 1 in `shape` keeps x's size
    return ops.broadcast_to(x, out)


@converter("Tile", (6, 13), static_inputs=(1,))
def _tile(node: NodeView, x: Any, repeats: Any) -> Any:
    sx = shape(x)
    reps = node.static_ints(repeats, "repeats")
    if len(reps) != len(sx) or any(r < 0 for r in reps):
        raise OnnxImportError(f"repeats {reps} must be {len(sx)} non-negative integers")
    # One broadcast over interleaved (repeat, size) axes, then merge each pair.
    spread = ops.reshape(x, tuple(v for d in sx for v in (1, d)))
    tiled = ops.broadcast_to(spread, tuple(v for d, r in zip(sx, reps) for v in (r, d)))
    return ops.reshape(tiled, tuple(d * r for d, r in zip(sx, reps)))


@converter("Pad", (2, 11, 13), ("mode", "pads", "value"), static_inputs=(1, 2))
def _pad(node: NodeView, x: Any, pads: Any = None, value: Any = None) -> Any:
    sx = shape(x)
    mode = node.attr("mode", "constant")
    if node.since < 11:
        amounts, fill = list(node.attr("pads")), node.attr("value", 0.0)
    else:
        amounts = node.static_ints(pads, "pads")
        fill = 0 if value is None else node.static(value, "constant_value").item()
    if len(amounts) != 2 * len(sx):
        raise OnnxImportError(f"pads {amounts} must have {2 * len(sx)} entries")
    begins, ends = amounts[:len(sx)], amounts[len(sx):]
    return pad_nd(x, begins, ends, mode, fill)


@converter("Constant", (1, 9, 11, 12, 13),
           ("value", "value_float", "value_floats", "value_int", "value_ints", "value_string",
            "value_strings"))
def _constant(node: NodeView) -> np.ndarray:
    if len(node.attrs) != 1:
        raise OnnxImportError(f"needs exactly one value attribute, has {sorted(node.attrs)}")
    ((name, value),) = node.attrs.items()
    kinds = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
             "value_ints": np.int64, "value_string": object, "value_strings": object}
    if name == "value":
        return np.asarray(value)
    return np.asarray(value, dtype=kinds[name])


@converter("ConstantOfShape", (9,), ("value",), static_inputs=(0,))
def _constant_of_shape(node: NodeView, target: Any) -> Tensor:
    dims = tuple(node.static_ints(target, "shape"))
    value = node.attr("value", np.zeros(1, np.float32))
    if value.size != 1:
        raise OnnxImportError(f"value must hold one element, holds {value.size}")
    # A broadcast view: its size is checked like any primitive's result, and never copied.
    return ops.broadcast_to(value.reshape(()), dims)


@converter("Shape", (1, 13, 15), ("start", "end"))
def _shape(node: NodeView, x: Any) -> np.ndarray:
    dims = shape(x)
    start, end = node.attr("start", 0), node.attr("end", len(dims))
    return np.asarray(dims[start:end], dtype=np.int64)


@converter("Cast", (6, 9, 13), ("to",))
def _cast(node: NodeView, x: Any) -> Any:
    from onnx import helper

    target = np.dtype(helper.tensor_dtype_to_np_dtype(node.attr("to")))
    if target.kind in "OUS" or dtype(x).kind in "OUS":
        raise OnnxImportError(f"Cast between strings and numbers ({dtype(x)} to {target}) is "
                              "not implemented")
    return ops.astype(x, target)
