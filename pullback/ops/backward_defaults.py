"""`BackwardOps`' default kernels, derived from the primitives' rules.

A primitive whose backward is a `BackwardOps` kernel says so beside its declaration
(`backward_kernel(tanh_p, "tanh_backward")`); the kernel's default body is then the
primitive's JVP rule, linearized and transposed, computed with the backend's own
forward ops. The derivative is written once, as the rule; a backend's fused kernel
(CpuBackend's) is the only other copy, and the test suite checks it against this one.
"""

from __future__ import annotations

from typing import Any

from ..ad import LinearGraph, Primitive, add_tangents, jvp_of, set_evaluator, transpose_linear
from ..backend import backward_ops


def backward_kernel(prim: Primitive, kernel: str) -> None:
    """Make `BackwardOps.<kernel>`, `prim`'s fused backward, default to `prim`'s rule
    transposed (the primitive must have a JVP rule and one differentiable operand)."""
    if not prim.has_derivative:
        raise ValueError(f"{prim.name}: {kernel} needs a JVP rule to derive its default from")
    backward_ops.derive_default(kernel, _transposed(prim))


def _transposed(prim: Primitive) -> Any:
    def body(backend: Any, upstream: Any, input_shape: tuple, inputs: tuple, output: Any,
             params: dict) -> Any:
        # The rule's ops, applied to arrays, run on `backend` for the length of the call.
        previous = set_evaluator(lambda p, args, kw: p.impl(backend, *args, **kw))
        try:
            graph = LinearGraph()
            tangent = graph.new_input(input_shape, upstream.dtype)
            graph.outputs = [jvp_of(prim, (tangent,), output, inputs, params)]
            (ct,) = transpose_linear(graph, (upstream,), add_tangents)
        finally:
            set_evaluator(previous)
        return ct

    return body
