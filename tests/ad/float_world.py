"""A tiny world of Python floats for testing the autodiff core without NumPy.

Declares float primitives with their rules (sin, cos, exp, mul bilinear, add
jointly linear, neg linear), an evaluator that computes them with `math`, and
`Var`, a minimal tracer that records `Node`s as primitives are applied to it.
"""

from __future__ import annotations

import math
from typing import Any

from pullback.ad import (
    Leaf,
    LinearVar,
    Node,
    Primitive,
    Zero,
    defbilinear,
    defjvp,
    defjvp_full,
    deflinear,
)

SCALAR = ()
DTYPE = "float"


def _scalar_rule(*args: Any, **params: Any) -> tuple:
    return SCALAR, DTYPE


def _primitive(name: str, **saves: bool) -> Primitive:
    prim = Primitive(name, **saves)
    prim.abstract_eval = _scalar_rule
    return prim


sin_p = _primitive("sin", saves_inputs=True)
cos_p = _primitive("cos", saves_inputs=True)
exp_p = _primitive("exp", saves_output=True)
mul_p = _primitive("mul")
add_p = _primitive("add")
neg_p = _primitive("neg")
# Declared with a forward but no derivative rule at all.
floor_p = _primitive("floor_no_rule")
# Differentiable in its first argument only.
scale_by_p = _primitive("scale_by", saves_inputs=True)


# The functions work on floats, `LinearVar`s (inside rules) and `Var`s (recorded).


def sin(x: Any) -> Any:
    return apply(sin_p, x)


def cos(x: Any) -> Any:
    return apply(cos_p, x)


def exp(x: Any) -> Any:
    return apply(exp_p, x)


def mul(a: Any, b: Any) -> Any:
    return apply(mul_p, a, b)


def add(a: Any, b: Any) -> Any:
    return apply(add_p, a, b)


def neg(x: Any) -> Any:
    return apply(neg_p, x)


def floor_no_rule(x: Any) -> Any:
    return apply(floor_p, x)


def scale_by(x: Any, s: Any) -> Any:
    return apply(scale_by_p, x, s)


defjvp(sin_p, lambda t, out, x: mul(t, cos(x)))
defjvp(cos_p, lambda t, out, x: neg(mul(t, sin(x))))
defjvp(exp_p, lambda t, out, x: mul(t, out))
defbilinear(mul_p, lambda ct, a, b: mul(ct, b), lambda ct, a, b: mul(a, ct))


def _add_jvp(tangents: tuple, output: Any, inputs: tuple) -> Any:
    ta, tb = tangents
    if type(ta) is Zero:
        return tb
    if type(tb) is Zero:
        return ta
    return add(ta, tb)


defjvp_full(add_p, _add_jvp)
deflinear(
    add_p,
    lambda ct, a, b: (
        ct if type(a) is LinearVar else None,
        ct if type(b) is LinearVar else None,
    ),
    linear_args=(0, 1),
)
deflinear(neg_p, lambda ct, x: (neg(ct),))
defjvp(scale_by_p, lambda t, out, x, s: mul(t, s), None)

IMPLS = {
    sin_p: math.sin,
    cos_p: math.cos,
    exp_p: math.exp,
    mul_p: lambda a, b: a * b,
    add_p: lambda a, b: a + b,
    neg_p: lambda x: -x,
    floor_p: math.floor,
    scale_by_p: lambda x, s: x * s,
}


def evaluate_floats(prim: Primitive, args: tuple, params: dict) -> float:
    """The evaluator for concrete operands: plain floats only."""
    for a in args:
        if not isinstance(a, (int, float)):
            raise TypeError(f"{prim.name}: the float world got a {type(a).__name__}")
    return float(IMPLS[prim](*args, **params))


class Var:
    """A float that records the primitives applied to it as `Node`s (an active value)."""

    __slots__ = ("node", "value")

    def __init__(self, value: float, node: Any):
        self.value = value
        self.node = node

    @classmethod
    def leaf(cls, value: float) -> Var:
        return cls(float(value), Leaf(SCALAR, DTYPE))

    def __mul__(self, other: Any) -> Any:
        return mul(self, other)

    def __rmul__(self, other: Any) -> Any:
        return mul(other, self)

    def __add__(self, other: Any) -> Any:
        return add(self, other)

    def __radd__(self, other: Any) -> Any:
        return add(other, self)

    def __neg__(self) -> Any:
        return neg(self)


def apply(prim: Primitive, *operands: Any) -> Any:
    """Apply `prim` to floats and `Var`s, recording a node when an operand is active."""
    values = tuple(o.value if isinstance(o, Var) else o for o in operands)
    out = prim.bind(*values)  # evaluated, or recorded into a linear graph
    parents = tuple(o.node if isinstance(o, Var) else None for o in operands)
    if all(p is None for p in parents):
        return out
    node = Node(
        prim,
        {},
        parents,
        values if prim.saves_inputs else None,
        out if prim.saves_output else None,
        (SCALAR,) * len(operands),
        SCALAR,
        DTYPE,
    )
    return Var(out, node)
