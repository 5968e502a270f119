"""Checkpointed regions in the float world: `run_region` computes the forward, and
`replay_jvp` replays it through the executor's `execute_forward` to give a JVP whose
transpose is the region's gradient (the core alone, on Python floats)."""

from __future__ import annotations

import math

import pytest
from float_world import cos_p, exp_p, mul_p, sin_p

from pullback.ad import (
    BackwardExecutor,
    LinearGraph,
    Region,
    RegionEquation,
    Zero,
    replay_jvp,
    run_region,
    transpose_linear,
)

X, Y = 0.7, -1.3


def _eqn(prim, slots, consts=None):
    consts = consts or (None,) * len(slots)
    return RegionEquation(prim, slots, consts, {}, ((),) * len(slots), (), "float", True)


def _region() -> Region:
    """out = exp(sin(x * y)) * 2.0, and a second output cos(x)."""
    return Region(2, [_eqn(mul_p, (0, 1)), _eqn(sin_p, (2,)), _eqn(exp_p, (3,)),
                      _eqn(mul_p, (4, None), (None, 2.0)), _eqn(cos_p, (0,))], (5, 6))


class CountingExecutor(BackwardExecutor):
    def __init__(self) -> None:
        self.replayed: list[str] = []

    def execute_forward(self, prim, args, params):
        self.replayed.append(prim.name)
        return super().execute_forward(prim, args, params)


def test_run_region_computes_the_forward() -> None:
    out, second = run_region(_region(), (X, Y), lambda prim, args, params: prim.bind(*args))
    assert out == pytest.approx(math.exp(math.sin(X * Y)) * 2.0)
    assert second == pytest.approx(math.cos(X))


def test_replay_jvp_transposes_to_the_gradient() -> None:
    graph = LinearGraph()
    tangents = (graph.new_input((), "float"), graph.new_input((), "float"))
    executor = CountingExecutor()
    t_out, _ = replay_jvp(_region(), (X, Y), tangents, executor)
    assert executor.replayed == ["mul", "sin", "exp", "mul", "cos"]
    graph.outputs = [t_out]
    gx, gy = transpose_linear(graph, (1.0,), lambda a, b: a + b)
    d = math.exp(math.sin(X * Y)) * math.cos(X * Y) * 2.0
    assert gx == pytest.approx(d * Y)
    assert gy == pytest.approx(d * X)


def test_replay_jvp_of_an_inactive_operand_is_symbolic() -> None:
    graph = LinearGraph()
    tangents = (Zero((), "float"), graph.new_input((), "float"))
    _, t_second = replay_jvp(_region(), (X, Y), tangents, BackwardExecutor())
    assert t_second is None  # cos(x) does not depend on y
