"""The errors ONNX import raises: each names the model part at fault.

`OnnxImportError` is the base (a ValueError): a file that is not a valid model,
shapes that contradict the model, tensors too large for memory. An unsupported
operator is an `UnsupportedOperatorError` listing every one at once, with a
reason, so a user learns the whole gap from one attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .registry import NodeView


class OnnxImportError(ValueError):
    """A model that pullback cannot load or run as asked."""


class BadModelError(OnnxImportError):
    """A file that is not a valid ONNX model, or one that contradicts itself."""


class UnsupportedOperatorError(OnnxImportError):
    """Operators (or their versions or attributes) that pullback does not implement.

    `unsupported` holds one `(op, reason)` pair per distinct problem, where `op`
    reads like `"StringNormalizer (opset 10)"`."""

    def __init__(self, unsupported: Sequence[tuple[str, str]]) -> None:
        self.unsupported = list(unsupported)
        lines = "\n".join(f"  {op}: {reason}" for op, reason in self.unsupported)
        super().__init__(
            f"the model uses {len(self.unsupported)} unsupported operator"
            f"{'s' if len(self.unsupported) != 1 else ''}:\n{lines}")


class NodeError(OnnxImportError):
    """A node failed to convert or run; the message names the node, its op and operands."""

    def __init__(self, node: NodeView, inputs: Sequence[object], reason: str) -> None:
        self.node_name = node.name
        self.op_type = node.op_type
        described = ", ".join(describe(v) for v in inputs) or "no inputs"
        super().__init__(f"{node.op_type} node {node.name!r} (inputs: {described}): {reason}")


def describe(value: object) -> str:
    """An operand as `(2, 3) float32`, a sequence as `sequence of 2`, an absent one as `-`."""
    if value is None:
        return "-"
    if isinstance(value, list):
        return f"sequence of {len(value)}"
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None:
        return type(value).__name__
    return f"{tuple(shape)} {dtype}"
