"""ONNX import and export.

`pullback.onnx.load(path_or_bytes)` returns a callable model (an `nn.Module`):
the graph's nodes become pullback primitives (through the converter table in
`registry`, filled by `pullback.onnx.ops`), run as an inference plan per input
signature, or recorded for training when loaded with `trainable=True`.
`pullback.onnx.export(module, example_input, path)` writes a module as an ONNX
file. The `onnx` package is needed only to load or export:
`pip install 'pullback[onnx]'`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING

from . import ops as _ops  # noqa: F401  (fills the converter table)
from . import recurrent as _recurrent  # noqa: F401  (registers the LSTM and GRU exporters)
from .errors import BadModelError, NodeError, OnnxImportError, UnsupportedOperatorError
from .export import ExportError, export, to_model
from .loader import default_max_tensor_bytes, parse, read_model
from .model import OnnxModel
from .registry import CONVERTERS, UNSUPPORTED

if TYPE_CHECKING:
    from onnx import ModelProto  # no type information: Any to mypy


def load(path_or_bytes: str | os.PathLike[str] | bytes | bytearray | memoryview | ModelProto,
         *, trainable: bool | Iterable[str] = False,
         max_tensor_bytes: int | None = None) -> OnnxModel:
    """Load an ONNX model from a path, bytes or a ModelProto.

    `trainable=True` makes every floating-point initializer that holds weights a
    parameter of the returned model (an `nn.Module`), to fine-tune: all but those
    read as shapes, axes, pads, bounds or other build-time values, and
    BatchNormalization's running statistics. A collection of initializer names
    makes exactly those parameters. `model.trainable_initializers()` lists why
    each initializer is or is not trainable.

    Raises `UnsupportedOperatorError` listing every operator pullback does not
    implement, `BadModelError` for a file that is not a valid, consistent model
    (or whose external data is outside its folder, a symlink or a device), and
    `OnnxImportError` for an opset newer than pullback implements, a tensor over
    `max_tensor_bytes` (by default half the machine's memory) or an initializer
    that cannot be trained. The model refuses, before allocating it, any input,
    node result or intermediate over `max_tensor_bytes`."""
    limit = default_max_tensor_bytes() if max_tensor_bytes is None else int(max_tensor_bytes)
    model = read_model(path_or_bytes, limit)
    return OnnxModel(parse(model, limit), limit, trainable)


def supported_operators() -> list[str]:
    """The operator types pullback can import, as "domain.Op" (the default domain bare)."""
    return sorted(f"{d}.{op}" if d else op for d, op in CONVERTERS)


__all__ = [
    "UNSUPPORTED",
    "BadModelError",
    "ExportError",
    "NodeError",
    "OnnxImportError",
    "OnnxModel",
    "UnsupportedOperatorError",
    "export",
    "load",
    "supported_operators",
    "to_model",
]
