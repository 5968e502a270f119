"""ONNX sequence ops: a sequence is a Python list of values.

Positions and lengths are plain numbers when the plan is built (they must be
constants); the tensors inside a sequence may depend on the inputs, so a
SplitToSequence then ConcatFromSequence stays part of the plan.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import ops
from ..errors import OnnxImportError
from ..registry import NodeView, converter
from .common import axis_of, dtype, shape
from .shape import split_along, split_sizes

_V = (11,)


def _sequence(value: Any, what: str = "the sequence") -> list:
    if not isinstance(value, list):
        raise OnnxImportError(f"{what} must be a sequence, not a tensor")
    return value


def _position(node: NodeView, pos: Any, length: int, inserting: bool) -> int:
    p = int(node.static(pos, "position").reshape(-1)[0]) if pos is not None else None
    high = length if inserting else length - 1
    if p is None:
        return length if inserting else length - 1
    if not -length <= p <= high:
        raise OnnxImportError(f"position {p} is out of range for a sequence of {length}")
    return p + length if p < 0 else p


@converter("SequenceEmpty", _V, ("dtype",))
def _empty(node: NodeView) -> list:
    return []


@converter("SequenceConstruct", _V)
def _construct(node: NodeView, *xs: Any) -> list:
    if len({dtype(x) for x in xs}) > 1:
        raise OnnxImportError("the tensors have different dtypes")
    return list(xs)


@converter("SequenceInsert", _V, static_inputs=(2,))
def _insert(node: NodeView, seq: Any, x: Any, pos: Any = None) -> list:
    items = list(_sequence(seq))
    if items and dtype(items[0]) != dtype(x):
        raise OnnxImportError(f"cannot insert a {dtype(x)} tensor into a sequence of "
                              f"{dtype(items[0])}")
    items.insert(_position(node, pos, len(items), True), x)
    return items


@converter("SequenceAt", _V, static_inputs=(1,))
def _at(node: NodeView, seq: Any, pos: Any) -> Any:
    items = _sequence(seq)
    if not items:
        raise OnnxImportError("the sequence is empty")
    return items[_position(node, pos, len(items), False)]


@converter("SequenceErase", _V, static_inputs=(1,))
def _erase(node: NodeView, seq: Any, pos: Any = None) -> list:
    items = list(_sequence(seq))
    if not items:
        raise OnnxImportError("the sequence is empty")
    del items[_position(node, pos, len(items), False)]
    return items


@converter("SequenceLength", _V)
def _length(node: NodeView, seq: Any) -> np.ndarray:
    return np.asarray(len(_sequence(seq)), dtype=np.int64)


@converter("SplitToSequence", _V, ("axis", "keepdims"), static_inputs=(1,))
def _split_to_sequence(node: NodeView, x: Any, split: Any = None) -> list:
    sx = shape(x)
    axis = axis_of(node, node.attr("axis", 0), len(sx))
    length = sx[axis]
    if split is None:
        pieces = split_along(x, axis, [1] * length)
        if not node.attr("keepdims", 1):
            pieces = tuple(ops.reshape(p, sx[:axis] + sx[axis + 1:]) for p in pieces)
        return list(pieces)
    sizes = node.static_ints(split, "split")
    if np.ndim(node.static(split, "split")) == 0:
        chunk = sizes[0]
        if chunk < 1:
            raise OnnxImportError(f"split {chunk} must be positive")
        sizes = [chunk] * (length // chunk) + ([length % chunk] if length % chunk else [])
    return list(split_along(x, axis, split_sizes(node, length, len(sizes), sizes)))


@converter("ConcatFromSequence", _V, ("axis", "new_axis"))
def _concat_from_sequence(node: NodeView, seq: Any) -> Any:
    items = _sequence(seq)
    if not items:
        raise OnnxImportError("the sequence is empty")
    ndim = len(shape(items[0]))
    if node.attr("new_axis", 0):
        return ops.stack(items, axis_of(node, node.attr("axis"), ndim + 1))
    return ops.concatenate(items, axis_of(node, node.attr("axis"), ndim))
