"""Linear graphs on floats: linearizing recorded nodes and whole graphs, running them
forwards (`evaluate_linear`) and backwards (`transpose_linear`), the adjoint identity,
symbolic zeros, and the errors for non-linear use of a tangent."""

from __future__ import annotations

import math
import random

import pytest
from float_world import (
    DTYPE,
    SCALAR,
    Var,
    add,
    add_p,
    cos,
    exp,
    mul,
    mul_p,
    neg,
    sin,
)

from pullback.ad import (
    BackwardExecutor,
    DerivativeError,
    LinearGraph,
    LinearVar,
    NotLinearError,
    Primitive,
    Zero,
    deflinear,
    evaluate_linear,
    linearize_graph,
    linearize_node,
    transpose_linear,
)

X, Y = 0.4, 1.7


def _plus(a, b):
    return a + b


def _linearize(out: Var) -> LinearGraph:
    node = out.node
    return linearize_node(node, node.inputs, node.output)


# ---------------------------------------------------------------- one node


def test_linearized_mul_node_is_the_product_rule() -> None:
    vx, vy = Var.leaf(X), Var.leaf(Y)
    graph = _linearize(vx * vy)
    assert len(graph.inputs) == 2
    (jt,) = evaluate_linear(graph, [0.3, -2.0])
    assert jt == pytest.approx(0.3 * Y + X * -2.0)
    ct_x, ct_y = transpose_linear(graph, [1.5], _plus)
    assert (ct_x, ct_y) == (pytest.approx(1.5 * Y), pytest.approx(1.5 * X))


@pytest.mark.parametrize(
    "f, derivative",
    [
        (sin, math.cos),
        (cos, lambda x: -math.sin(x)),
        (exp, math.exp),
        (neg, lambda x: -1.0),
    ],
    ids=["sin", "cos", "exp", "neg"],
)
def test_linearized_unary_node_transposes_to_its_derivative(f, derivative) -> None:
    vx = Var.leaf(X)
    graph = _linearize(f(vx))
    (jt,) = evaluate_linear(graph, [2.0])
    (ct,) = transpose_linear(graph, [3.0], _plus)
    assert jt == pytest.approx(2.0 * derivative(X))
    assert ct == pytest.approx(3.0 * derivative(X))


def test_inactive_operand_has_no_input_and_gets_no_cotangent() -> None:
    vx = Var.leaf(X)
    graph = _linearize(vx * 5.0)
    assert graph.inputs[1] is None
    # One active operand: no tangent sum is recorded, only the scaling.
    assert [eq.primitive for eq in graph.equations] == [mul_p]
    assert transpose_linear(graph, [2.0], _plus) == (pytest.approx(10.0), None)


def test_two_active_operands_sum_their_contributions_with_the_tangent_add() -> None:
    vx, vy = Var.leaf(X), Var.leaf(Y)
    graph = _linearize(vx * vy)
    assert [eq.primitive for eq in graph.equations] == [mul_p, mul_p, add_p]


def test_zero_cotangent_reaches_no_input() -> None:
    vx, vy = Var.leaf(X), Var.leaf(Y)
    graph = _linearize(sin(vx) * vy)
    assert transpose_linear(graph, [Zero(SCALAR, DTYPE)], _plus) == (None, None)
    assert transpose_linear(graph, [None], _plus) == (None, None)


# ---------------------------------------------------------------- evaluate_linear and zeros


def test_evaluate_linear_treats_none_as_a_symbolic_zero_tangent() -> None:
    vx, vy = Var.leaf(X), Var.leaf(Y)
    graph = _linearize(vx + vy)
    assert evaluate_linear(graph, [2.0, None]) == [2.0]
    assert evaluate_linear(graph, [None, -3.0]) == [-3.0]
    (both_zero,) = evaluate_linear(graph, [None, None])
    assert type(both_zero) is Zero


def test_evaluate_linear_of_product_with_one_zero_tangent() -> None:
    vx, vy = Var.leaf(X), Var.leaf(Y)
    graph = _linearize(vx * vy)
    assert evaluate_linear(graph, [2.0, None]) == [pytest.approx(2.0 * Y)]


def test_output_independent_of_the_inputs_linearizes_to_a_zero() -> None:
    vx, vy = Var.leaf(X), Var.leaf(Y)
    out = sin(vy)
    graph = linearize_graph([out.node], [vx.node], BackwardExecutor())
    (jt,) = evaluate_linear(graph, [1.0])
    assert type(jt) is Zero
    assert transpose_linear(graph, [1.0], _plus) == (None,)


# ---------------------------------------------------------------- whole graphs


def _two_outputs(x: Var, y: Var, z: Var) -> tuple[Var, Var]:
    s = sin(x * y)
    return s + cos(z) * x, exp(neg(s)) * z


def _jacobian(x: float, y: float, z: float) -> list[list[float]]:
    s, c = math.sin(x * y), math.cos(x * y)
    e = math.exp(-s)
    return [
        [y * c + math.cos(z), x * c, -math.sin(z) * x],
        [-e * y * c * z, -e * x * c * z, e],
    ]


POINT = (0.3, -0.8, 1.1)


def _linearized_two_outputs() -> LinearGraph:
    leaves = [Var.leaf(v) for v in POINT]
    outs = _two_outputs(*leaves)
    return linearize_graph([o.node for o in outs], [v.node for v in leaves], BackwardExecutor())


def test_linearize_graph_jvp_matches_the_analytic_jacobian() -> None:
    graph = _linearized_two_outputs()
    jac = _jacobian(*POINT)
    for column in range(3):
        tangent = [1.0 if i == column else 0.0 for i in range(3)]
        got = evaluate_linear(graph, tangent)
        assert got == [pytest.approx(jac[row][column], abs=1e-12) for row in range(2)]


def test_transpose_of_linearized_graph_is_the_jacobian_transpose() -> None:
    graph = _linearized_two_outputs()
    jac = _jacobian(*POINT)
    for row in range(2):
        ct = [1.0 if i == row else 0.0 for i in range(2)]
        got = transpose_linear(graph, ct, _plus)
        assert got == tuple(pytest.approx(jac[row][c], abs=1e-12) for c in range(3))


@pytest.mark.parametrize("seed", range(5))
def test_adjoint_identity_holds_on_the_float_graph(seed) -> None:
    rng = random.Random(seed)
    graph = _linearized_two_outputs()
    tangent = [rng.uniform(-2, 2) for _ in range(3)]
    ct = [rng.uniform(-2, 2) for _ in range(2)]
    jt = evaluate_linear(graph, tangent)
    jt_ct = transpose_linear(graph, ct, _plus)
    lhs = sum(c * j for c, j in zip(ct, jt, strict=True))
    rhs = sum(c * t for c, t in zip(jt_ct, tangent, strict=True))
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12)


def test_linearize_graph_asks_the_executor_for_saved_operands() -> None:
    seen = []

    class Spy(BackwardExecutor):
        def saved_operands(self, node):
            seen.append(node.primitive.name)
            return super().saved_operands(node)

    vx = Var.leaf(X)
    out = cos(sin(vx))
    graph = linearize_graph([out.node], [vx.node], Spy())
    assert seen == ["sin", "cos"]
    assert evaluate_linear(graph, [1.0]) == [pytest.approx(-math.sin(math.sin(X)) * math.cos(X))]


def test_backward_pass_equals_transpose_of_linearize_graph() -> None:
    from pullback.ad import backward_pass

    leaves = [Var.leaf(v) for v in POINT]
    outs = _two_outputs(*leaves)
    executor = BackwardExecutor()
    graph = linearize_graph([o.node for o in outs], [v.node for v in leaves], executor)
    via_graph = transpose_linear(graph, [0.5, -1.5], _plus)
    cts = backward_pass([(outs[0].node, 0.5), (outs[1].node, -1.5)], executor)
    assert tuple(cts[v.node] for v in leaves) == tuple(pytest.approx(g) for g in via_graph)


# ---------------------------------------------------------------- non-linear use of a tangent


def _tangent() -> tuple[LinearGraph, LinearVar]:
    graph = LinearGraph()
    return graph, graph.new_input(SCALAR, DTYPE)


def test_non_linear_primitive_on_a_linear_var_raises_not_linear_error() -> None:
    _, t = _tangent()
    with pytest.raises(NotLinearError, match="sin is not linear"):
        sin(t)
    assert issubclass(NotLinearError, DerivativeError)


def test_bilinear_primitive_on_two_linear_vars_raises() -> None:
    _, t = _tangent()
    with pytest.raises(NotLinearError, match=r"mul.*one at a time"):
        mul(t, t)


def test_primitive_linear_only_in_its_first_operand_rejects_a_tangent_second() -> None:
    import float_world

    scale = Primitive("scale")
    scale.abstract_eval = float_world._scalar_rule
    deflinear(scale, lambda ct, x, s: (mul(ct, s), None))
    graph, t = _tangent()
    assert type(scale.bind(t, 2.0)) is LinearVar
    with pytest.raises(NotLinearError, match=r"scale is not linear in argument\(s\) \(1,\)"):
        scale.bind(2.0, t)
    assert len(graph.equations) == 1


def test_operands_from_two_linear_graphs_raise() -> None:
    _, t1 = _tangent()
    _, t2 = _tangent()
    with pytest.raises(NotLinearError, match="two different linear graphs"):
        add(t1, t2)


def test_recording_a_linear_function_and_transposing_it() -> None:
    graph, t = _tangent()
    u = graph.new_input(SCALAR, DTYPE)
    graph.outputs = [add(mul(3.0, t), neg(u)), mul(t, -2.0)]
    assert all(type(o) is LinearVar for o in graph.outputs)
    assert evaluate_linear(graph, [1.0, 2.0]) == [1.0, -2.0]
    assert transpose_linear(graph, [1.0, 10.0], _plus) == (3.0 - 20.0, -1.0)


def test_deflinear_jointly_linear_without_jvp_full_is_rejected() -> None:
    prim = Primitive("joint_without_rule")
    with pytest.raises(ValueError, match=r"joint_without_rule.*jvp_full"):
        deflinear(prim, lambda ct, a, b: (ct, ct), linear_args=(0, 1))
