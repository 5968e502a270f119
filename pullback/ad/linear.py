"""Linear graphs: traced from JVP rules, transposed into cotangent programs.

`LinearGraph` records the equations that applying linear primitives to
`LinearVar` operands produces. `transpose_linear` runs the graph backwards
through each primitive's transpose rule, accumulating cotangents with the
caller's `add` and freeing each one as soon as it is consumed.
`evaluate_linear` runs it forwards on concrete tangents.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .core import DerivativeError, LinearVar, Primitive, Zero


class NotLinearError(DerivativeError):
    """A non-linear primitive was applied to a tangent inside a linear function."""


class Equation:
    """One primitive application inside a linear graph."""

    __slots__ = ("args", "out", "params", "primitive")

    def __init__(self, primitive: Primitive, args: tuple, params: dict, out: LinearVar):
        self.primitive = primitive
        self.args = args
        self.params = params
        self.out = out

    def __repr__(self) -> str:
        def name(a: Any) -> str:
            return f"v{id(a) % 10000}" if type(a) is LinearVar else type(a).__name__

        args = ", ".join(name(a) for a in self.args)
        return f"{name(self.out)} = {self.primitive.name}({args})"


class LinearGraph:
    """A linear function of `inputs`, as a list of equations."""

    def __init__(self) -> None:
        # One per operand; None for an inactive one, which gets no cotangent.
        self.inputs: list[LinearVar | None] = []
        self.equations: list[Equation] = []
        self.outputs: list[Any] = []

    def new_input(self, shape: Any, dtype: Any) -> LinearVar:
        var = LinearVar(self, shape, dtype)
        self.inputs.append(var)
        return var

    def record(self, prim: Primitive, args: tuple, params: dict) -> LinearVar:
        """Record `prim(*args)`; called by `Primitive.bind` when an operand is ours."""
        linear = [i for i, a in enumerate(args) if type(a) is LinearVar]
        if prim.transpose is None:
            raise NotLinearError(
                f"{prim.name} is not linear, but it was applied to a tangent "
                f"(argument {linear[0]}) inside a linear function"
            )
        for i in linear:
            if args[i].graph is not self:
                raise NotLinearError(f"{prim.name}: operands come from two different linear graphs")
        if not prim.linear_args.issuperset(linear) or (prim.bilinear and len(linear) > 1):
            raise NotLinearError(
                f"{prim.name} is not linear in argument(s) {tuple(linear)}; "
                f"it is linear in {tuple(sorted(prim.linear_args))}"
                + (" one at a time" if prim.bilinear else "")
            )
        if not prim.bilinear:
            for i, arg in enumerate(args):
                if i in prim.linear_args and type(arg) is not LinearVar and not _is_zero(arg):
                    raise NotLinearError(
                        f"{prim.name} of a tangent and a constant (argument {i}) is affine, "
                        "not linear"
                    )
        assert prim.abstract_eval is not None, f"{prim.name} was declared without a shape rule"
        shape, dtype = prim.abstract_eval(*args, **params)
        out = LinearVar(self, shape, dtype)
        self.equations.append(Equation(prim, args, params, out))
        return out

    def __repr__(self) -> str:
        lines = [f"LinearGraph(inputs={len(self.inputs)})"]
        lines += [f"  {eq!r}" for eq in self.equations]
        return "\n".join(lines)


def _is_zero(value: Any) -> bool:
    """A constant that keeps a jointly linear op linear: a symbolic or a literal zero."""
    return type(value) is Zero or (isinstance(value, (int, float)) and value == 0)


def transpose_linear(
    graph: LinearGraph, cts: Sequence[Any], add: Callable[[Any, Any], Any]
) -> tuple:
    """Cotangents of a linear graph's inputs from its outputs' cotangents.

    A `None` or `Zero` cotangent is symbolic: equations that only it reaches
    are skipped, and an input it alone reaches gets None.
    """
    env: dict[LinearVar, Any] = {}
    for out, ct in zip(graph.outputs, cts):
        if type(out) is LinearVar and ct is not None and type(ct) is not Zero:
            _accumulate(env, out, ct, add)
    for eq in reversed(graph.equations):
        ct = env.pop(eq.out, None)
        if ct is None:
            continue
        transpose = eq.primitive.transpose
        assert transpose is not None  # `record` takes only primitives that have one
        in_cts = transpose(ct, *eq.args, **eq.params)
        for arg, in_ct in zip(eq.args, in_cts):
            if type(arg) is LinearVar and in_ct is not None and type(in_ct) is not Zero:
                _accumulate(env, arg, in_ct, add)
    return tuple(None if var is None else env.get(var) for var in graph.inputs)


def _accumulate(env: dict, var: LinearVar, ct: Any, add: Callable[[Any, Any], Any]) -> None:
    previous = env.get(var)
    env[var] = ct if previous is None else add(previous, ct)


def evaluate_linear(graph: LinearGraph, tangents: Sequence[Any]) -> list:
    """Run a linear graph forwards on concrete tangents (None or Zero: a zero input)."""
    env: dict[LinearVar, Any] = {}
    for var, tangent in zip(graph.inputs, tangents):
        if var is not None:  # an inactive operand's slot, which no equation reads
            env[var] = tangent if tangent is not None else Zero(var.shape, var.dtype)
    for eq in graph.equations:
        args = tuple(env[a] if type(a) is LinearVar else a for a in eq.args)
        env[eq.out] = _apply_with_zeros(eq, args)
    return [env.get(out, out) if type(out) is LinearVar else out for out in graph.outputs]


def _apply_with_zeros(eq: Equation, args: tuple) -> Any:
    """Apply a linear equation; a zero input makes a zero output where linearity allows."""
    zeros = [type(a) is Zero for a in args]
    if not any(zeros):
        return eq.primitive.bind(*args, **eq.params)
    out = eq.out
    linear = [i for i, a in enumerate(eq.args) if type(a) is LinearVar]
    if all(zeros[i] for i in linear):
        return Zero(out.shape, out.dtype)
    # Jointly linear (add, concatenate): the rule sees the zeros and handles them.
    jvp_full = eq.primitive.jvp_full
    assert jvp_full is not None, f"{eq.primitive.name}: jointly linear without a jvp_full rule"
    return jvp_full(
        tuple(args[i] if i in linear else None for i in range(len(args))),
        None,
        tuple(None if i in linear else args[i] for i in range(len(args))),
        **eq.params,
    )
