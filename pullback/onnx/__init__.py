"""ONNX import: `pullback.onnx.load(path_or_bytes)` returns a callable model.

The graph's nodes become pullback primitives (through the converter table in
`registry`, filled by `pullback.onnx.ops`), run as an inference plan per input
signature. The `onnx` package is needed only when a model is loaded:
`pip install 'pullback[onnx]'`.
"""

from __future__ import annotations

from typing import Any

from . import ops as _ops  # noqa: F401  (fills the converter table)
from .errors import BadModelError, NodeError, OnnxImportError, UnsupportedOperatorError
from .loader import default_max_tensor_bytes, parse, read_model
from .model import OnnxModel
from .registry import CONVERTERS, UNSUPPORTED


def load(path_or_bytes: Any, *, max_tensor_bytes: int | None = None) -> OnnxModel:
    """Load an ONNX model from a path, bytes or a ModelProto.

    Raises `UnsupportedOperatorError` listing every operator pullback does not
    implement, `BadModelError` for a file that is not a valid, consistent model,
    and `OnnxImportError` for a tensor over `max_tensor_bytes` (by default half
    the machine's memory)."""
    limit = default_max_tensor_bytes() if max_tensor_bytes is None else int(max_tensor_bytes)
    model = read_model(path_or_bytes)
    return OnnxModel(parse(model, limit), limit)


def supported_operators() -> list[str]:
    """The operator types pullback can import, as "domain.Op" (the default domain bare)."""
    return sorted(f"{d}.{op}" if d else op for d, op in CONVERTERS)


__all__ = [
    "UNSUPPORTED",
    "BadModelError",
    "NodeError",
    "OnnxImportError",
    "OnnxModel",
    "UnsupportedOperatorError",
    "load",
    "supported_operators",
]
