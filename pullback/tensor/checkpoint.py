"""`checkpoint(fn)`: activation checkpointing, as `torch.utils.checkpoint` and
`jax.checkpoint`.

Calling a checkpointed function runs `fn` once without recording, noting the
primitive applications it makes as a `Region` (ad/remat.py). One node per output
stands for the whole region and saves only the region's operands (its inputs and
the tensors it reads from outside, parameters included). Its JVP rule replays the
region through the executor's `execute_forward`, so the activations inside exist
only while that node's backward step runs. In a plan the region is one
`checkpoint` step, whose operands are all the activation cache keeps of it.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

import numpy as np

from ..ad import (
    DerivativeError,
    Primitive,
    Region,
    RegionEquation,
    Slot,
    current_evaluator,
    defjvp_full,
    replay_jvp,
    run_region,
    set_evaluator,
)
from ..ops.shape import stop_gradient_p
from .backward import EagerExecutor
from .eager import _FLOATS, Tensor, evaluate, saved_as_float
from .protect import TensorNode, protect
from .state import grad_enabled, grad_mode

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from ..ops.hints import Shape

_P = ParamSpec("_P")
# What a checkpointed function returns: a tensor, or a tuple (or list) of tensors.
_Out = TypeVar("_Out", bound="Tensor | Sequence[Tensor]")


def _impl(backend: Any, *operands: Any, region: Region, index: int) -> Any:
    def apply(prim: Primitive, args: tuple[Any, ...], params: dict[str, Any]) -> Any:
        return prim.impl(backend, *args, **params)

    return run_region(region, operands, apply)[index]


def _shape_rule(*operands: Any, region: Region, index: int) -> tuple[Shape, np.dtype[Any]]:
    eqn = region.equations[region.outputs[index] - region.n_operands]
    return eqn.out_shape, eqn.dtype


def _replay_jvp(tangents: tuple[Any, ...], output: Any, inputs: tuple[Any, ...], *,
                region: Region, index: int) -> Any:
    # Recorded (create_graph) when the rules run recorded: grad of grad replays on
    # tensors connected to the outer graph.
    executor = EagerExecutor(create_graph=grad_enabled())
    try:
        return replay_jvp(region, inputs, tangents, executor)[index]
    except DerivativeError as err:
        raise type(err)(f"{err} (inside pb.checkpoint, whose forward is replayed and "
                        "differentiated op by op)") from None


#: The primitive that stands for a checkpointed region; `index` picks one output.
checkpoint_p = Primitive("checkpoint", saves_inputs=True)
checkpoint_p.exact_inputs = True  # operands are replayed as they were (indices stay ints)
checkpoint_p.impl = _impl
checkpoint_p.abstract_eval = _shape_rule
defjvp_full(checkpoint_p, _replay_jvp)


def checkpoint(fn: Callable[_P, _Out]) -> Callable[_P, _Out]:
    """A function like `fn` whose forward is recomputed during backward instead of
    saving its activations, in eager mode, under the transforms and in plans.

    `fn` takes tensors (and any other arguments) and returns a tensor or a tuple of
    tensors; it may read parameters and other tensors it closes over. Its forward is
    replayed as it first ran: the same ops on the same values, whatever Python
    control flow or random draws chose them. Each output of a tuple replays the
    whole function.
    """
    if not callable(fn):
        raise TypeError(f"checkpoint: expected a function, got {type(fn).__name__}")

    @functools.wraps(fn)
    def checkpointed(*args: _P.args, **kwargs: _P.kwargs) -> _Out:
        evaluator = current_evaluator()
        if evaluator is evaluate and not grad_enabled():
            return fn(*args, **kwargs)  # nothing records, so nothing would be saved
        capture = _Capture()
        previous = set_evaluator(capture)
        try:
            with grad_mode(False):
                out = fn(*args, **kwargs)
        finally:
            set_evaluator(previous)
        single = isinstance(out, Tensor)
        outs: Any = (out,) if single else out  # checked here
        if not isinstance(outs, (tuple, list)) or not all(isinstance(o, Tensor) for o in outs):
            raise TypeError("checkpoint: the function must return a tensor or a tuple of "
                            f"tensors, not {type(out).__name__}")
        region, produced = capture.region(outs)
        results = list(outs)
        if evaluator is evaluate:
            _record(region, capture.operands, [o for o, p in zip(outs, produced) if p])
        else:
            # Traced into a plan, or inside another checkpoint: one application per
            # output through the evaluator there, which computes it again.
            index = 0
            for i, p in enumerate(produced):
                if p:
                    results[i] = checkpoint_p.bind(*capture.operands, region=region,
                                                   index=index)
                    index += 1
        if single:
            return cast("_Out", results[0])
        return type(out)(results)  # type: ignore[call-arg]  # a tuple or a list

    return checkpointed


def _record(region: Region, operands: list[Any], outputs: list[Tensor]) -> None:
    """Record one node per output of the region, each saving the operands only."""
    parents = tuple(o._node if type(o) is Tensor else None for o in operands)
    if all(p is None for p in parents):
        return  # nothing differentiable flows in: the outputs carry no gradient
    arrays = tuple(o._data if type(o) is Tensor else o for o in operands)
    in_shapes = tuple(a.shape for a in arrays)
    for index, (out, slot) in enumerate(zip(outputs, region.outputs)):
        if not region.equations[slot - region.n_operands].differentiable:
            continue  # an integer or boolean result
        node = TensorNode(checkpoint_p, {"region": region, "index": index}, parents, arrays,
                          None, in_shapes, out.shape, out.dtype)
        for a in arrays:
            protect(a, "checkpoint")
        out._node = node


class _Capture:
    """The evaluator installed while a checkpointed function first runs: computes each
    op eagerly (recording nothing) and notes it as a region equation.

    A tensor or array the function reads that no noted op produced is an operand of
    the region; an array that aliases a produced value (`x.detach()`, `x.numpy()`)
    reads that value without its gradient. Produced values are known through weak
    references, so the function's intermediates are freed as it runs."""

    def __init__(self) -> None:
        self.operands: list[Any] = []
        self._operand_slot: dict[int, int] = {}  # id(operand) -> its slot
        # id(tensor or array) -> (weak reference, provisional slot) of produced values
        self._produced: dict[int, tuple[Any, int]] = {}
        self._equations: list[tuple[Any, ...]] = []  # RegionEquation's fields
        self._param_slots: list[Slot] = []

    # Slots are provisional while the function runs: operand j is j, the result of
    # equation k is -(k + 1); `region` numbers them operands first.

    def __call__(self, prim: Primitive, args: tuple[Any, ...], params: dict[str, Any]
                 ) -> Tensor:
        slots = tuple(self._slot(a) for a in args)
        consts = tuple(a if s is None else None for a, s in zip(args, slots))
        noted = {k: self._param(v) for k, v in params.items()}
        out = evaluate(prim, args, params)
        in_shapes = tuple(a.shape if isinstance(a, (Tensor, np.ndarray)) else () for a in args)
        dtype = out.dtype
        rule_inputs = None
        if prim.saves_inputs and not prim.exact_inputs and any(
                getattr(a, "dtype", dtype).kind in "iub" for a in args):
            def rule_inputs(values: tuple[Any, ...], dtype: np.dtype[Any] = dtype
                            ) -> tuple[Any, ...]:
                return saved_as_float(values, dtype)  # as the eager evaluator saves them
        self._equations.append((prim, slots, consts, noted, in_shapes, out.shape, dtype,
                                prim.differentiable and dtype in _FLOATS, rule_inputs))
        slot = -len(self._equations)
        self._produced[id(out)] = (weakref.ref(out), slot)
        self._produced[id(out._data)] = (weakref.ref(out._data), slot)
        return out

    def _slot(self, arg: Any) -> int | None:
        if not isinstance(arg, (Tensor, np.ndarray)):
            return None  # a number, None, an object of the core's: a constant
        return self._value_slot(arg)

    def _value_slot(self, arg: Tensor | NDArray[Any]) -> int:
        seen = self._produced.get(id(arg))
        if seen is not None and seen[0]() is arg:
            return seen[1]
        slot = self._operand_slot.get(id(arg))
        if slot is not None:
            return slot
        data = arg._data if type(arg) is Tensor else arg
        seen = self._produced.get(id(data))
        if seen is not None and seen[0]() is data:
            return self._detached(arg, seen[1])
        slot = self._operand_slot[id(arg)] = len(self.operands)
        self.operands.append(arg)
        return slot

    def _detached(self, alias: Tensor | NDArray[Any], source: int) -> int:
        """An equation reading `source` without its gradient, standing for `alias`."""
        dtype, shape = alias.dtype, alias.shape
        self._equations.append((stop_gradient_p, (source,), (None,), {}, (shape,), shape,
                                dtype, False, None))
        slot = -len(self._equations)
        self._produced[id(alias)] = (weakref.ref(alias), slot)
        return slot

    def _param(self, value: Any) -> Any:
        if isinstance(value, (Tensor, np.ndarray)):
            slot = Slot(self._value_slot(value))
            self._param_slots.append(slot)
            return slot
        if isinstance(value, (tuple, list)):
            items = [self._param(v) for v in value]
            if any(a is not b for a, b in zip(items, value)):
                return type(value)(items)
        return value

    def region(self, outs: Sequence[Tensor]) -> tuple[Region, list[bool]]:
        """The region, and for each output whether the region computes it (an output
        that is an operand or was made outside any op is returned as it is)."""
        n = len(self.operands)

        def final(slot: int) -> int:
            return slot if slot >= 0 else n - slot - 1

        for p in self._param_slots:
            p.index = final(p.index)
        equations = [RegionEquation(prim, tuple(None if s is None else final(s) for s in slots),
                                    consts, params, in_shapes, shape, dtype, differentiable,
                                    rule_inputs)
                     for prim, slots, consts, params, in_shapes, shape, dtype, differentiable,
                     rule_inputs in self._equations]
        outputs: list[int] = []
        produced: list[bool] = []
        for o in outs:
            seen = self._produced.get(id(o))
            made = seen is not None and seen[0]() is o
            produced.append(made)
            if seen is not None and made:
                outputs.append(final(seen[1]))
        return Region(n, equations, tuple(outputs)), produced
