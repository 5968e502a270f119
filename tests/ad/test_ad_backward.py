"""`backward_pass` over hand-recorded float graphs with the default `BackwardExecutor`:
gradients against analytic derivatives, accumulation, symbolic zeros, targets,
release, deep chains and the missing-rule error."""

from __future__ import annotations

import math

import pytest
from float_world import (
    Var,
    cos,
    exp,
    floor_no_rule,
    mul,
    mul_p,
    neg,
    scale_by,
    sin,
)

from pullback.ad import (
    BackwardExecutor,
    DerivativeError,
    GraphReleasedError,
    Primitive,
    backward_pass,
    defbilinear,
    toposort,
)

X, Y = 0.7, -1.3

# name, f(x, y), analytic (df/dx, df/dy); None: the output does not depend on it.
GRADIENT_TABLE = [
    ("sin_of_product", lambda x, y: sin(x * y),
     lambda x, y: (y * math.cos(x * y), x * math.cos(x * y))),
    ("cos_plus_neg", lambda x, y: cos(x) + neg(y),
     lambda x, y: (-math.sin(x), -1.0)),
    ("exp_of_sin_times_y", lambda x, y: exp(sin(x)) * y,
     lambda x, y: (math.exp(math.sin(x)) * math.cos(x) * y, math.exp(math.sin(x)))),
    ("fan_out_x_x_y", lambda x, y: x * x * y,
     lambda x, y: (2 * x * y, x * x)),
    ("shared_node_squared", lambda x, y: (lambda s: s * s)(sin(x)),
     lambda x, y: (2 * math.sin(x) * math.cos(x), None)),
    ("constant_operands", lambda x, y: neg(2.0 * x) + (x + 3.0) * y,
     lambda x, y: (-2.0 + y, x + 3.0)),
    ("cos_of_cos", lambda x, y: cos(cos(x)) + y * y * y,
     lambda x, y: (math.sin(math.cos(x)) * math.sin(x), 3 * y * y)),
]


def _gradients(f, x: float, y: float, executor=None) -> tuple:
    vx, vy = Var.leaf(x), Var.leaf(y)
    out = f(vx, vy)
    cts = backward_pass([(out.node, 1.0)], executor or BackwardExecutor())
    return cts.get(vx.node), cts.get(vy.node)


@pytest.mark.parametrize(
    "f, expected", [row[1:] for row in GRADIENT_TABLE], ids=[row[0] for row in GRADIENT_TABLE]
)
def test_backward_pass_matches_analytic_gradients(f, expected) -> None:
    got = _gradients(f, X, Y)
    for g, e in zip(got, expected(X, Y), strict=True):
        if e is None:
            assert g is None
        else:
            assert g == pytest.approx(e, rel=1e-12, abs=1e-12)


def test_backward_pass_scales_with_the_root_cotangent() -> None:
    vx = Var.leaf(X)
    out = sin(vx)
    cts = backward_pass([(out.node, 2.5)], BackwardExecutor())
    assert cts[vx.node] == pytest.approx(2.5 * math.cos(X))


def test_backward_pass_sums_cotangents_of_several_roots() -> None:
    vx = Var.leaf(X)
    a, b = sin(vx), cos(vx)
    cts = backward_pass([(a.node, 2.0), (b.node, 3.0), (a.node, 1.0)], BackwardExecutor())
    assert cts[vx.node] == pytest.approx(3.0 * math.cos(X) - 3.0 * math.sin(X))


def test_fan_out_accumulates_through_add_operands() -> None:
    calls = []

    class Counting(BackwardExecutor):
        def add_operands(self, a, b):
            calls.append((a, b))
            return super().add_operands(a, b)

    vx = Var.leaf(X)
    out = sin(vx) * cos(vx)
    cts = backward_pass([(out.node, 1.0)], Counting())
    assert cts[vx.node] == pytest.approx(math.cos(2 * X))
    assert len(calls) == 1
    assert all(isinstance(v, float) for pair in calls for v in pair)


def test_inactive_leaf_gets_no_cotangent_entry() -> None:
    vx, vy = Var.leaf(X), Var.leaf(Y)
    out = sin(vx)
    cts = backward_pass([(out.node, 1.0)], BackwardExecutor())
    assert vy.node not in cts
    assert set(cts) == {vx.node}


def test_constant_operand_transpose_is_never_run(monkeypatch) -> None:
    import float_world

    ran = []
    spy = Primitive("spy_mul")
    spy.abstract_eval = float_world._scalar_rule
    defbilinear(
        spy,
        lambda ct, a, b: ran.append("lhs") or mul(ct, b),
        lambda ct, a, b: ran.append("rhs") or mul(a, ct),
    )
    monkeypatch.setitem(float_world.IMPLS, spy, float_world.IMPLS[mul_p])
    vx = Var.leaf(X)
    out = float_world.apply(spy, vx, 4.0)
    assert out.node.parents[1] is None
    cts = backward_pass([(out.node, 1.0)], BackwardExecutor())
    assert cts[vx.node] == pytest.approx(4.0)
    assert ran == ["lhs"]


def test_targets_stop_the_traversal_and_skip_unrelated_branches() -> None:
    vx, vy = Var.leaf(X), Var.leaf(Y)
    hidden = sin(vx)
    # floor has no derivative rule, but it only leads to y, which is not a target.
    out = cos(hidden) + floor_no_rule(vy) * 2.0
    cts = backward_pass([(out.node, 1.0)], BackwardExecutor(), targets=[hidden.node])
    assert set(cts) == {hidden.node}
    assert cts[hidden.node] == pytest.approx(-math.sin(math.sin(X)))


def test_missing_jvp_rule_raises_derivative_error_naming_the_primitive() -> None:
    vx = Var.leaf(X)
    out = sin(floor_no_rule(vx))
    with pytest.raises(DerivativeError, match="floor_no_rule"):
        backward_pass([(out.node, 1.0)], BackwardExecutor())


def test_missing_rule_off_the_active_path_is_not_an_error() -> None:
    vx = Var.leaf(X)
    out = sin(vx) * floor_no_rule(3.7)  # a constant: recorded nowhere
    cts = backward_pass([(out.node, 1.0)], BackwardExecutor())
    assert cts[vx.node] == pytest.approx(3.0 * math.cos(X))


def test_argument_without_jvp_rule_raises_naming_the_argument() -> None:
    vx, vs = Var.leaf(X), Var.leaf(2.0)
    out = scale_by(vx, vs)
    with pytest.raises(DerivativeError, match=r"scale_by.*argument 1"):
        backward_pass([(out.node, 1.0)], BackwardExecutor())
    # Inactive in that argument, the other rule is enough.
    ok = scale_by(vx, 2.0)
    assert backward_pass([(ok.node, 1.0)], BackwardExecutor())[vx.node] == pytest.approx(2.0)


def test_release_frees_saved_values_and_a_second_pass_raises() -> None:
    vx = Var.leaf(X)
    out = sin(vx * vx)
    first = backward_pass([(out.node, 1.0)], BackwardExecutor(), release=True)
    assert first[vx.node] == pytest.approx(2 * X * math.cos(X * X))
    nodes = [n for n in toposort([out.node]) if n.primitive is not None]
    assert all(n.released and n.inputs is None and n.output is None for n in nodes)
    with pytest.raises(GraphReleasedError, match="retain_graph"):
        backward_pass([(out.node, 1.0)], BackwardExecutor())


def test_without_release_the_graph_can_be_traversed_twice() -> None:
    vx = Var.leaf(X)
    out = exp(vx * 3.0)
    executor = BackwardExecutor()
    first = backward_pass([(out.node, 1.0)], executor)
    second = backward_pass([(out.node, 1.0)], executor)
    assert first[vx.node] == second[vx.node] == pytest.approx(3.0 * math.exp(3.0 * X))


CHAIN = 10_000


@pytest.mark.parametrize("step", ["sin", "mul_constant"])
def test_ten_thousand_node_chain_differentiates_without_recursion(step) -> None:
    vx = Var.leaf(0.9)
    v, value, derivative = vx, 0.9, 1.0
    for _ in range(CHAIN):
        if step == "sin":
            derivative *= math.cos(value)
            value = math.sin(value)
            v = sin(v)
        else:
            derivative *= 1.0001
            v = v * 1.0001
    order = toposort([v.node])
    assert len(order) == CHAIN + 1
    assert order[0] is vx.node and order[-1] is v.node
    cts = backward_pass([(v.node, 1.0)], BackwardExecutor(), release=True)
    assert cts[vx.node] == pytest.approx(derivative, rel=1e-9)


def test_toposort_puts_every_node_after_its_parents_once() -> None:
    vx, vy = Var.leaf(X), Var.leaf(Y)
    s = sin(vx)
    out = s * (s + vy) + cos(s)
    order = toposort([out.node, s.node])
    position = {id(n): i for i, n in enumerate(order)}
    assert len(position) == len(order)
    for node in order:
        for parent in node.parents:
            if parent is not None:
                assert position[id(parent)] < position[id(node)]
    assert {id(vx.node), id(vy.node)} <= set(position)
