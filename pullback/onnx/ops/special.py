"""Ops that cannot be steps of a static plan, and so make a model run eagerly:
StringNormalizer (strings, computed in NumPy, inference only) and Gradient from
ai.onnx.preview.training (computed with pullback's own reverse mode)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...tensor import Tensor, enable_grad, vjp
from ..errors import OnnxImportError
from ..registry import NodeView, converter

TRAINING_DOMAIN = "ai.onnx.preview.training"
_PLAIN_LOCALES = ("", "C", "POSIX", "en", "en_US", "en_US.UTF-8", "en-US")


@converter("StringNormalizer", (10,),
           ("case_change_action", "is_case_sensitive", "locale", "stopwords"),
           eager_only="works on strings, in NumPy")
def _string_normalizer(node: NodeView, x: Any) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "OUS":
        raise OnnxImportError("the input must be a string tensor")
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
        raise OnnxImportError(f"the input must have shape [C] or [1, C], not {x.shape}")
    action = node.attr("case_change_action", "NONE")
    if action not in ("NONE", "LOWER", "UPPER"):
        raise OnnxImportError(f"case_change_action {action!r} is not NONE, LOWER or UPPER")
    locale = node.attr("locale", "")
    if locale not in _PLAIN_LOCALES:
        # Python's case mapping is Unicode's default; a locale's own rules would differ.
        raise OnnxImportError(f"locale {locale!r} is not implemented (only the default)")
    sensitive = bool(node.attr("is_case_sensitive", 0))
    stopwords = node.attr("stopwords", [])
    if sensitive:
        stops = set(stopwords)
        kept = [s for s in x.reshape(-1).tolist() if s not in stops]
    else:
        stops = {w.lower() for w in stopwords}
        kept = [s for s in x.reshape(-1).tolist() if s.lower() not in stops]
    if action == "LOWER":
        kept = [s.lower() for s in kept]
    elif action == "UPPER":
        kept = [s.upper() for s in kept]
    if not kept:
        kept = [""]  # all dropped: one empty string, as the ONNX spec says
    out = np.empty(len(kept), dtype=object)
    out[:] = kept
    return out.reshape((1, -1) if x.ndim == 2 else (-1,))


@converter("Gradient", (1,), ("xs", "y", "zs"), domain=TRAINING_DOMAIN,
           eager_only="differentiates part of the graph with pullback's reverse mode")
def _gradient(node: NodeView, *values: Any) -> tuple:
    from ..interpreter import RunContext, apply

    xs, zs, y = list(node.attr("xs")), list(node.attr("zs", [])), node.attr("y")
    if len(values) != len(xs) + len(zs):
        raise OnnxImportError(f"takes the values of xs {xs} and zs {zs} as inputs, got "
                              f"{len(values)}")
    spec = node.run.spec
    known = set(xs) | set(zs) | set(spec.initializers)
    path = _nodes_computing(spec, y, known)
    run = RunContext(eager=True, max_tensor_bytes=node.run.max_tensor_bytes, spec=spec)

    def forward(*primals: Any) -> Any:
        env: dict[str, Any] = dict(spec.initializers)
        env.update(zip(zs, values[len(xs):]))
        env.update(zip(xs, primals))
        for n in path:
            view = NodeView(n.proto, n.index, n.since, n.attrs, run)
            outs = apply(view, n.converter, [env.get(i) if i else None for i in n.proto.input],
                         run)
            env.update(zip(view.outputs, outs))
        return env[y]

    primals = [_as_float_tensor(v) for v in values[:len(xs)]]
    with enable_grad():
        out, pullback = vjp(forward, *primals)
        grads = pullback(np.ones(out.shape, dtype=out.dtype))
    return tuple(grads)


def _as_float_tensor(value: Any) -> Any:
    from ...tensor import tensor

    data = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
    if data.dtype.kind != "f":
        raise OnnxImportError(f"can differentiate only with respect to floating tensors, not "
                              f"{data.dtype}")
    return tensor(data)


def _nodes_computing(spec: Any, target: str, known: set) -> list:
    """The nodes (in graph order) that compute `target` from the names in `known`."""
    producer = {}
    for n in spec.nodes:
        for o in n.proto.output:
            producer[o] = n
    needed, stack = set(), [target]
    while stack:
        name = stack.pop()
        if name in known or not name:
            continue
        n = producer.get(name)
        if n is None:
            raise OnnxImportError(f"y {target!r} depends on {name!r}, which is neither computed "
                                  "by a node nor among xs, zs or the initializers")
        if n.converter.op_type == "Gradient":
            raise OnnxImportError("a Gradient of a Gradient is not implemented")
        if id(n) not in needed:
            needed.add(id(n))
            stack.extend(n.proto.input)
    return [n for n in spec.nodes if id(n) in needed]
