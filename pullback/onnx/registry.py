"""The table of op converters: one per ONNX op type, as JAX keeps rules in tables.

A converter turns one ONNX node into pullback primitives. It declares the
schema versions it implements (the `since_version` of the op's ONNX schema)
and the attributes it reads, so that a model is checked against the table
when it is loaded, before anything runs. `NodeView` is what a converter sees:
the node's attributes and the run's services (static values).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..tensor import Tensor
from .errors import OnnxImportError

if TYPE_CHECKING:
    from .interpreter import RunContext

DEFAULT_DOMAIN = ""


@dataclass(frozen=True)
class Converter:
    op_type: str
    fn: Callable[..., Any]
    versions: frozenset[int]  # the schema since_versions this converter implements
    attrs: frozenset[str]
    domain: str = DEFAULT_DOMAIN
    # False for ops that must not be evaluated ahead of time (none yet; kept for random ops).
    foldable: bool = True
    # Why the op cannot be lowered into a static plan, when it cannot (strings, Gradient).
    eager_only: str | None = None
    # Input positions read as build-time values (shapes, axes, pads, clip bounds): whatever
    # feeds them stays a constant when initializers become trainable parameters.
    static_inputs: frozenset[int] = frozenset()
    # Input positions that hold statistics, not weights (BatchNormalization's running mean
    # and variance): kept constant when fine-tuning, as PyTorch keeps them buffers.
    statistics_inputs: frozenset[int] = frozenset()


#: Every converter, by (domain, op_type).
CONVERTERS: dict[tuple[str, str], Converter] = {}

#: Operators pullback knows and deliberately does not implement, with the reason.
UNSUPPORTED: dict[tuple[str, str], str] = {}


def highest_opset() -> int:
    """The newest default-domain opset pullback implements: the highest schema version
    among its converters. Past it, an operator may have changed in ways the converter
    table has never been checked against."""
    return max(v for c in CONVERTERS.values() if c.domain == DEFAULT_DOMAIN for v in c.versions)


def converter(
    op_type: str,
    versions: Iterable[int],
    attrs: Iterable[str] = (),
    *,
    domain: str = DEFAULT_DOMAIN,
    foldable: bool = True,
    eager_only: str | None = None,
    static_inputs: Iterable[int] = (),
    statistics_inputs: Iterable[int] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `fn(node, *inputs)` as the converter of `op_type`; it returns one value
    or a tuple, one per node output (absent optional inputs arrive as None)."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        key = (domain, op_type)
        if key in CONVERTERS:
            raise ValueError(f"a converter for {op_type!r} is already registered")
        CONVERTERS[key] = Converter(op_type, fn, frozenset(versions), frozenset(attrs), domain,
                                    foldable, eager_only, frozenset(static_inputs),
                                    frozenset(statistics_inputs))
        return fn

    return register


class DataDependentError(Exception):
    """A converter needs, at trace time, a value computed from the graph's inputs: the
    graph's shapes depend on input values, so it cannot become one static plan."""


_REQUIRED = object()


class NodeView:
    """One node as a converter sees it: name, op type, attributes, and the run's services."""

    # `proto` is the onnx NodeProto (onnx has no type information).
    def __init__(self, proto: Any, index: int, since: int, attrs: dict[str, Any],
                 run: RunContext) -> None:
        self.proto = proto
        self.op_type = proto.op_type
        self.name = proto.name or f"#{index} ({', '.join(proto.output) or 'no outputs'})"
        self.inputs = list(proto.input)
        self.outputs = list(proto.output)
        self.since = since  # the schema version that applies: what semantics to follow
        self.attrs = attrs
        self.run = run

    def attr(self, name: str, default: Any = _REQUIRED) -> Any:
        if name in self.attrs:
            return self.attrs[name]
        if default is _REQUIRED:
            raise OnnxImportError(f"{self.op_type} node {self.name!r}: the required attribute "
                                  f"{name!r} is missing")
        return default

    def static(self, value: object, what: str) -> np.ndarray:
        """`value` as a NumPy array known while the plan is built (a shape, axes, pads):
        a constant, or anything while running eagerly."""
        if isinstance(value, np.ndarray):
            return value
        if isinstance(value, Tensor):
            if value.requires_grad:
                # Reading it as a number would cut its gradient: refuse rather than drop it.
                raise OnnxImportError(f"{self.op_type} node {self.name!r}: its {what} is "
                                      "computed from a tensor that requires grad (a trainable "
                                      "parameter or input); it must be a constant")
            if self.run.eager:
                return value.numpy()
            raise DataDependentError(f"{self.op_type} node {self.name!r}: its {what} is "
                                     "computed from the graph's inputs")
        raise OnnxImportError(f"{self.op_type} node {self.name!r}: {what} must be a tensor, "
                              f"not {type(value).__name__}")

    def static_ints(self, value: object, what: str) -> list[int]:
        array = self.static(value, what)
        if array.dtype.kind not in "iu":
            raise OnnxImportError(f"{self.op_type} node {self.name!r}: {what} must be "
                                  f"integers, not {array.dtype}")
        return [int(v) for v in array.reshape(-1)]
