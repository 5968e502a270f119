"""`BackwardOps`' default kernels, derived from the primitives' rules.

A primitive whose backward is a `BackwardOps` kernel says so beside its declaration
(`backward_kernel(tanh_p, "tanh_backward")`); the kernel's default body is then the
primitive's JVP rule, linearized and transposed, computed with the backend's own
forward ops. The derivative is written once, as the rule; a backend's fused kernel
(CpuBackend's) is the only other copy, and the test suite checks it against this one.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ..ad import (
    LinearGraph,
    Primitive,
    Zero,
    add_tangents,
    jvp_of,
    set_evaluator,
    transpose_linear,
)
from ..backend import backward_ops
from ..backend.base import Array, Backend


def backward_kernel(prim: Primitive, kernel: str, symmetric: bool = False) -> None:
    """Make `BackwardOps.<kernel>`, `prim`'s fused backward, default to `prim`'s rule
    transposed (`rule_vjp` on the backend the kernel is called on). `symmetric`: its
    Jacobian is its own transpose (an elementwise op's is diagonal; softmax's is
    symmetric), so the JVP rule applied to upstream is the cotangent."""
    if not prim.has_derivative:
        raise ValueError(f"{prim.name}: {kernel} needs a JVP rule to derive its default from")
    backward_ops.derive_default(kernel, partial(rule_vjp, prim, symmetric=symmetric))


def rule_vjp(prim: Primitive, backend: Backend, upstream: Array, inputs: tuple[Any, ...],
             output: Array | None, params: dict[str, Any], shapes: tuple[Any, ...],
             needed: tuple[bool, ...] | None = None, symmetric: bool = False
             ) -> tuple[Any, ...]:
    """The cotangents of `prim`'s operands (of shapes `shapes`) from `upstream`, by its
    JVP rule transposed, computed on `backend`'s forward ops; None for an operand not
    `needed` (all are, by default) or that no cotangent reaches. `inputs` and `output`
    are what the rule reads (None for what it does not); `symmetric` as in
    `backward_kernel`."""
    needed = needed or (True,) * len(shapes)
    # The rule's ops, applied to arrays, run on `backend` for the length of the call.
    previous = set_evaluator(partial(_on_backend, backend))
    try:
        if symmetric:
            rule = prim.jvp[0] if prim.jvp else None
            if rule is None:
                raise ValueError(f"{prim.name}: a symmetric backward is its JVP rule of the "
                                 "first operand, and it declares none")
            return (rule(upstream, output, *inputs, **params),)
        transpose = prim.transpose
        if transpose is not None and all(
                i in prim.linear_args for i, wanted in enumerate(needed) if wanted):
            # Its transpose rule is the transposed JVP, with no graph to trace.
            return _transposed(transpose, upstream, inputs, params, shapes, needed)
        graph = LinearGraph()
        tangents = tuple(graph.new_input(shape, upstream.dtype) if wanted
                         else Zero(shape, upstream.dtype)
                         for shape, wanted in zip(shapes, needed, strict=True))
        graph.outputs = [jvp_of(prim, tangents, output, inputs, params)]
        found = iter(transpose_linear(graph, (upstream,), add_tangents))
    finally:
        set_evaluator(previous)
    return tuple(next(found) if wanted else None for wanted in needed)


def _on_backend(backend: Backend, prim: Primitive, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
    """`prim` computed on `backend`'s forward ops."""
    return prim.impl(backend, *args, **kwargs)


def _transposed(transpose: Callable[..., Any], upstream: Array, inputs: tuple[Any, ...],
                params: dict[str, Any], shapes: tuple[Any, ...], needed: tuple[bool, ...]
                ) -> tuple[Any, ...]:
    # A bilinear primitive is transposed in one operand at a time, the other a constant.
    cts: list[Any] = []
    for i, wanted in enumerate(needed):
        if not wanted:
            cts.append(None)
            continue
        graph = LinearGraph()
        args = list(inputs)
        args[i] = graph.new_input(shapes[i], upstream.dtype)
        cts.append(transpose(upstream, *args, **params)[i])
    return tuple(cts)
