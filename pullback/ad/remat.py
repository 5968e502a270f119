"""Checkpointed regions: a forward kept as equations and replayed during backward.

A `Region` is what activation checkpointing keeps of a function instead of its
activations: the primitive applications it made, over slots (the region's
operands first, then each equation's result). `run_region` computes it forward;
`replay_jvp` replays it through the executor (`execute_forward`) and applies each
primitive's JVP rule to the recomputed values, so the activations inside a region
exist only while the backward step that transposes its JVP runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .core import Primitive, Zero, jvp_of

if TYPE_CHECKING:
    from .executor import BackwardExecutor


class Slot:
    """A region value named inside an equation's parameters (a `where` condition
    computed in the region): resolved to that value whenever the region runs."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"Slot({self.index})"


class RegionEquation:
    """One primitive application of a region.

    `slots[i]` is the slot operand i reads, or None for a constant, held in
    `consts[i]`. `in_shapes` / `out_shape` / `dtype` describe the operands for
    symbolic zeros, as a recorded `Node` does; `differentiable` is False where the
    eager evaluator would record nothing (an integer result, a comparison).
    `rule_inputs`, when given, turns the operands into what the JVP rule reads (the
    layer above saves integer operands as floats for some rules).
    """

    __slots__ = (
        "consts",
        "differentiable",
        "dtype",
        "frees",
        "in_shapes",
        "out_shape",
        "param_slots",
        "params",
        "primitive",
        "rule_inputs",
        "slots",
    )

    def __init__(self, primitive: Primitive, slots: tuple, consts: tuple, params: dict,
                 in_shapes: tuple, out_shape: Any, dtype: Any, differentiable: bool,
                 rule_inputs: Callable[[tuple], tuple] | None = None):
        self.primitive = primitive
        self.slots = slots
        self.consts = consts
        self.params = params
        self.param_slots = any(_has_slot(v) for v in params.values())
        self.in_shapes = in_shapes
        self.out_shape = out_shape
        self.dtype = dtype
        self.differentiable = differentiable
        self.rule_inputs = rule_inputs
        self.frees: tuple[int, ...] = ()  # slots no later equation reads (set by Region)

    def operands(self, values: list) -> tuple:
        return tuple(c if s is None else values[s] for s, c in zip(self.slots, self.consts))

    def resolved_params(self, values: list) -> dict:
        if not self.param_slots:
            return self.params
        return {k: _resolve(v, values) for k, v in self.params.items()}


def _has_slot(value: Any) -> bool:
    if type(value) is Slot:
        return True
    return isinstance(value, (tuple, list)) and any(_has_slot(v) for v in value)


def _resolve(value: Any, values: list) -> Any:
    if type(value) is Slot:
        return values[value.index]
    if isinstance(value, (tuple, list)) and _has_slot(value):
        return type(value)(_resolve(v, values) for v in value)
    return value


class Region:
    """A function's forward as equations over slots: `n_operands` operands, then one
    slot per equation, and the slots of its `outputs`."""

    def __init__(self, n_operands: int, equations: list[RegionEquation], outputs: tuple):
        self.n_operands = n_operands
        self.equations = equations
        self.outputs = outputs
        # Each value is dropped after the last equation that reads it (outputs stay).
        last: dict[int, int] = {}
        for k, eqn in enumerate(equations):
            for s in eqn.slots:
                if s is not None:
                    last[s] = k
            for v in eqn.params.values():
                for s in _slots_in(v):
                    last[s] = k
        frees: list[list[int]] = [[] for _ in equations]
        for s, k in last.items():
            if s not in outputs:
                frees[k].append(s)
        for eqn, f in zip(equations, frees):
            eqn.frees = tuple(f)

    def __repr__(self) -> str:
        names = ", ".join(e.primitive.name for e in self.equations)
        return f"Region({self.n_operands} operands: {names})"


def _slots_in(value: Any) -> list[int]:
    if type(value) is Slot:
        return [value.index]
    if isinstance(value, (tuple, list)):
        return [s for v in value for s in _slots_in(v)]
    return []


def run_region(region: Region, operands: Sequence[Any],
               apply: Callable[[Primitive, tuple, dict], Any]) -> list:
    """The region's output values, each equation computed by `apply(prim, args, params)`."""
    values = list(operands) + [None] * len(region.equations)
    n = region.n_operands
    for k, eqn in enumerate(region.equations):
        values[n + k] = apply(eqn.primitive, eqn.operands(values), eqn.resolved_params(values))
        for s in eqn.frees:
            values[s] = None
    return [values[s] for s in region.outputs]


def replay_jvp(region: Region, operands: Sequence[Any], tangents: Sequence[Any],
               executor: BackwardExecutor) -> list:
    """The tangents of the region's outputs (None where zero), from its operands' (a
    `Zero` or None where inactive): the forward is replayed with the executor's
    `execute_forward`, and each equation's JVP rule is applied to the recomputed values,
    as `linearize_graph` does to saved ones."""
    size = region.n_operands + len(region.equations)
    values = list(operands) + [None] * len(region.equations)
    tans: list[Any] = [None if type(t) is Zero else t for t in tangents]
    tans += [None] * (size - len(tans))
    n = region.n_operands
    for k, eqn in enumerate(region.equations):
        args = eqn.operands(values)
        params = eqn.resolved_params(values)
        out = values[n + k] = executor.execute_forward(eqn.primitive, args, params)
        if eqn.differentiable and any(s is not None and tans[s] is not None
                                      for s in eqn.slots):
            ts = tuple(Zero(shape, eqn.dtype) if s is None or tans[s] is None else tans[s]
                       for s, shape in zip(eqn.slots, eqn.in_shapes))
            if eqn.rule_inputs is not None:
                args = eqn.rule_inputs(args)
            t = jvp_of(eqn.primitive, ts, out, args, params)
            tans[n + k] = None if type(t) is Zero else t
        for s in eqn.frees:
            values[s] = None
            tans[s] = None
    return [tans[s] for s in region.outputs]
