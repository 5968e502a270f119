"""Running a GraphSpec's nodes in order over an environment of named values.

A value is a NumPy array when it is known before any input arrives (an
initializer, a constant, a shape, or anything computed from those only), a
pullback Tensor when it depends on the graph's inputs, or a list for an ONNX
sequence. Nodes whose inputs are all known are evaluated at once (constant
folding), so that shapes, axes and pads are plain numbers when a plan is
traced; only the rest becomes steps of the plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ad import set_evaluator
from ..tensor import Tensor, no_grad
from ..tensor.eager import evaluate
from .errors import NodeError, OnnxImportError
from .loader import GraphSpec
from .registry import DataDependentError, NodeView


@dataclass
class RunContext:
    """What a run offers converters: whether it is eager, and the memory budget."""

    eager: bool
    max_tensor_bytes: int
    spec: GraphSpec


def is_static(value: Any) -> bool:
    if isinstance(value, list):
        return all(is_static(v) for v in value)
    return value is None or isinstance(value, np.ndarray)


def _as_static(value: Any) -> Any:
    if isinstance(value, list):
        return [_as_static(v) for v in value]
    if isinstance(value, Tensor):
        return value._data
    if value is None or isinstance(value, np.ndarray):
        return value
    return np.asarray(value)


class _bounded_evaluation:
    """Every primitive a node applies is checked against the memory budget from its shape
    rule, before the evaluator underneath (eager, or the tracer, which computes too)
    allocates its result: one check for every node's outputs and intermediates, however
    its converter composes them."""

    def __init__(self, limit: int):
        self.limit = limit

    def __enter__(self) -> None:
        self._inner = set_evaluator(self)

    def __exit__(self, *exc: Any) -> None:
        set_evaluator(self._inner)

    def __call__(self, prim: Any, args: tuple, params: dict) -> Any:
        try:
            shape, dtype = prim.abstract_eval(*args, **params)
            dims = tuple(int(d) for d in shape)
            dtype = None if dtype is None else np.dtype(dtype)
        except Exception:
            # An operand the shape rule refuses: the evaluator raises its own error.
            return self._inner(prim, args, params)
        check_size(dims, dtype, self.limit, f"its {prim.name} result")
        return self._inner(prim, args, params)


def check_size(shape: Any, dtype: Any, limit: int, what: str) -> None:
    """Refuse a tensor over the memory budget (`limit` bytes), or with a negative
    dimension, before it is allocated; `what` says what computes it."""
    dims = tuple(int(d) for d in shape)
    dtype = np.dtype(dtype) if dtype is not None else None
    described = f"{dims} {dtype}" if dtype is not None else f"{dims}"
    if any(d < 0 for d in dims):
        raise OnnxImportError(f"{what} of shape {described} has a negative dimension")
    count = 1
    for d in dims:
        count *= d
    nbytes = count * (dtype.itemsize if dtype is not None else 8)
    if nbytes > limit:
        raise OnnxImportError(f"{what} of shape {described} needs {nbytes:,} bytes, over the "
                              f"limit of {limit:,} (load(..., max_tensor_bytes=...) raises it)")


class _eager_evaluation:
    """Evaluate primitives on concrete arrays even while a plan is being traced: what a
    folded node computes is a constant of the plan, not a step of it."""

    def __enter__(self) -> None:
        self._previous = set_evaluator(evaluate)
        self._no_grad = no_grad()
        self._no_grad.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._no_grad.__exit__(*exc)
        set_evaluator(self._previous)


def last_uses(spec: GraphSpec) -> list[list[str]]:
    """Per node, the names no later node reads (graph outputs are never among them)."""
    last: dict[str, int] = {}
    for i, node in enumerate(spec.nodes):
        for name in node.proto.input:
            if name:
                last[name] = i
    for out in spec.outputs:
        last.pop(out.name, None)
    frees: list[list[str]] = [[] for _ in spec.nodes]
    for name, i in last.items():
        frees[i].append(name)
    return frees


def run_graph(spec: GraphSpec, env: dict[str, Any], run: RunContext,
              frees: list[list[str]] | None = None) -> dict[str, Any]:
    """Run every node, adding its outputs to `env`; returns `env`."""
    for i, node in enumerate(spec.nodes):
        view = NodeView(node.proto, node.index, node.since, node.attrs, run)
        values: list[Any] = []
        for name in node.proto.input:
            if not name:
                values.append(None)  # an omitted optional input
            elif name in env:
                values.append(env[name])
            else:
                raise NodeError(view, values, f"its input {name!r} is not computed by any "
                                              "earlier node, nor an input or initializer")
        outs = apply(view, node.converter, values, run)
        for name, value in zip(view.outputs, outs):
            if name:
                env[name] = value
        if frees is not None:
            for name in frees[i]:
                env.pop(name, None)  # let go of what no later node reads
    return env


def apply(view: NodeView, converter: Any, values: list[Any], run: RunContext) -> tuple:
    """One node's outputs, folded when all its inputs are known, errors naming the node."""
    fold = not run.eager and converter.foldable and is_static(values)
    try:
        if fold:
            with _eager_evaluation(), _bounded_evaluation(run.max_tensor_bytes):
                result = converter.fn(view, *values)
        else:
            with _bounded_evaluation(run.max_tensor_bytes):
                result = converter.fn(view, *values)
    except (DataDependentError, NodeError):
        raise
    except OnnxImportError as err:
        raise NodeError(view, values, _strip_prefix(str(err), view)) from None
    except Exception as err:
        raise NodeError(view, values, f"{err}") from err
    outs = result if isinstance(result, tuple) else (result,)
    if len(outs) < len([o for o in view.outputs if o]):
        raise NodeError(view, values, f"produces {len(outs)} outputs but the node names "
                                      f"{len(view.outputs)}")
    if fold:
        outs = tuple(_as_static(v) for v in outs)
    return outs


def _strip_prefix(message: str, view: NodeView) -> str:
    prefix = f"{view.op_type} node {view.name!r}: "
    return message[len(prefix):] if message.startswith(prefix) else message
