"""Fusion of elementwise chains: a plan's forward runs a chain such as
`relu(matmul_out + bias)` as one generated kernel, one pass over memory where the
ops one by one would make one pass each and materialize every intermediate.

A chain grows through a value only when that value has no other reader: not a later
step, not the plan's result, and (in a TRAINING plan) not any backward step. So the
backward pass, which reads only saved values, runs unchanged over the member ops.
A primitive is fusible when it declares a `Fusion` (its scalar code); one without is
never fused. The generated kernel runs only on a backend whose `runs_plan_kernels()`
is true (CpuBackend and ThreadedCpuBackend themselves); any other backend, a subclass
of theirs included, runs the members one by one through its own ops.

An op whose result only a relu reads runs with it as one step where its primitive
declares how (`then_relu`: a training batch norm's kernel writes relu's result):
ResNet-20's training step, one process in turns, best 8 of 12: 219-261 ms apart,
206-256 as one step (bench/RESULTS.md).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..kernels.core import SUPPORTED_DTYPES, kernel
from ..ops.elementwise import relu_p
from .epilogue import conv_epilogues, lower_epilogue, matmul_epilogues
from .graph import Eqn, StaticGraph, Var, resolve_params

# A chain this small is not worth a kernel: NumPy's own loops are as fast there, and
# each distinct chain costs a compile (cached on disk) the first time it runs.
MIN_ELEMENTS = 4096
# Longer chains are split: Numba's compile time grows with the body (a 10,000-op chain
# would take minutes), and past a few dozen ops a pass over memory is a small part.
MAX_MEMBERS = 32


@dataclass(eq=False)
class Step:
    """One forward step of a plan: one equation, or a fused chain of them."""

    impl: Any
    args: tuple  # Var or Python scalar operands
    params: dict
    out: Var
    eqns: list[Eqn] = field(default_factory=list)
    epilogue: bool = False  # a convolution and its epilogue (epilogue.py), not a chain
    norm_relu: bool = False  # an op and the relu after it (`then_relu`), not a chain

    @property
    def fused(self) -> bool:
        return len(self.eqns) > 1

    @property
    def name(self) -> str:
        if self.fused:
            return "fused(" + ", ".join(e.primitive.name for e in self.eqns) + ")"
        return self.eqns[0].primitive.name


def schedule(graph: StaticGraph, keep: set[int]) -> list[Step]:
    """The graph's equations as forward steps: elementwise chains fused, each
    convolution with the per-channel ops, residual add and relu after it, and each
    dense layer's product with its bias and relu (epilogue.py);
    `keep` holds the values something besides the next op needs (saved for backward)."""
    readers = {index: len(eqns) for index, eqns in graph.readers().items()}
    pinned = set(keep) | {v.index for v in graph.outputs}
    groups = {**conv_epilogues(graph, pinned), **matmul_epilogues(graph, pinned)}
    grouped = {id(eqn) for members in groups.values() for eqn, _, _ in members}
    constants = graph.computed_consts
    relu_after = _relus_after_norms(graph, pinned, readers)
    grouped |= {id(relu) for relu in relu_after.values()}  # in their batch norm's step
    steps: list[Step] = []
    open_chain: dict[int, Step] = {}  # a fusible step's output index -> its step
    for eqn in graph.eqns:
        relu = relu_after.get(id(eqn))
        if relu is not None:
            steps.append(_norm_relu(eqn, relu))
            continue
        if id(eqn) in grouped:
            # The convolution runs where its last member was: its operands exist then.
            members = groups.get(id(eqn))
            if members is not None:
                impl, args = lower_epilogue(members, constants)
                steps.append(Step(impl, args, {}, eqn.out, [e for e, _, _ in members], True))
            continue
        chain = _chain_to_extend(eqn, open_chain, readers, pinned)
        if chain is None:
            step = _single(eqn)
            steps.append(step)
        else:
            # The chain runs where its last member was: its other operands exist by
            # then, and its inner values have no reader that could need them earlier.
            step = chain
            del open_chain[step.out.index]
            if steps[-1] is not step:
                steps.remove(step)
                steps.append(step)
            step.eqns.append(eqn)
            step.out = eqn.out
        if _fusible(eqn):
            open_chain[eqn.out.index] = step
    for step in steps:
        if step.fused and not (step.epilogue or step.norm_relu):
            _lower_chain(step)
    return steps


def _relus_after_norms(graph: StaticGraph, pinned: set[int], readers: dict[int, int]
                       ) -> dict[int, Eqn]:
    """Equations whose primitive declares `then_relu` and whose result only a relu reads
    (and nothing keeps): the relu, by id() of the equation."""
    relu_of: dict[int, Eqn] = {}
    for eqn in graph.eqns:
        if eqn.primitive is not relu_p or not isinstance(eqn.args[0], Var):
            continue
        y = eqn.args[0]
        first = getattr(y, "producer", None)
        if (first is not None and first.primitive.then_relu is not None
                and not first.param_vars and readers.get(y.index) == 1
                and y.index not in pinned and y.dtype in SUPPORTED_DTYPES):
            relu_of[id(first)] = eqn
    return relu_of


def _norm_relu(first: Eqn, relu: Eqn) -> Step:
    """One step for relu(first(...)): the primitive's `then_relu` (a training batch norm's
    kernel writing relu's result), taking the step's buffer as `out`. Its backward is
    the two ops' own: batch norm's reads x, relu's its output."""
    rule, params = first.primitive.then_relu, first.params
    assert rule is not None  # `_relus_after_norms` chose it for declaring one

    def run(backend: Any, *args: Any, out: Any = None) -> Any:
        return rule(backend, *args, out=out, **params)

    return Step(run, first.args, {}, relu.out, [first, relu], norm_relu=True)


def _single(eqn: Eqn) -> Step:
    """A step of one equation. Parameters computed from the inputs (a `where` condition)
    become trailing operands, put back in place at each call."""
    traced = eqn.param_vars
    impl = eqn.primitive.impl
    if not traced:
        return Step(impl, eqn.args, eqn.params, eqn.out, [eqn])
    n, params = len(eqn.args), eqn.params
    indices = [v.index for v in traced]

    def run(backend: Any, *values: Any) -> Any:
        current = resolve_params(params, dict(zip(indices, values[n:])))
        return impl(backend, *values[:n], **current)

    return Step(run, eqn.args + traced, {}, eqn.out, [eqn])


def _fusible(eqn: Eqn) -> bool:
    if eqn.primitive.fusion is None or eqn.params:
        return False
    dtype = eqn.out.dtype
    if dtype not in SUPPORTED_DTYPES:
        return False
    return all(isinstance(a, float) or (isinstance(a, Var) and a.dtype == dtype)
               for a in eqn.args)


def _chain_to_extend(eqn: Eqn, open_chain: dict[int, Step], readers: dict[int, int],
                     pinned: set[int]) -> Step | None:
    if not _fusible(eqn) or int(np.prod(eqn.out.shape)) < MIN_ELEMENTS:
        return None
    for a in eqn.args:
        if isinstance(a, Var) and a.index in open_chain and readers[a.index] == 1 \
                and a.index not in pinned and len(open_chain[a.index].eqns) < MAX_MEMBERS:
            return open_chain[a.index]
    return None


def _lower_chain(step: Step) -> None:
    """Give a fused step its operands (every Var or scalar its members read from
    outside the chain) and its kernel."""
    inside = {e.out.index for e in step.eqns}
    operands: list[Any] = []
    names: dict[Any, str] = {}

    def name_of(a: Any) -> str:
        key = a.index if isinstance(a, Var) else ("scalar", type(a), a)
        if isinstance(a, Var) and a.index in inside:
            return f"t{a.index}"
        if key not in names:
            names[key] = f"a{len(operands)}"
            operands.append(a)
        return names[key]

    lines = []
    scope: dict[str, Any] = {}
    for e in step.eqns:
        args = [name_of(a) for a in e.args]
        fusion = e.primitive.fusion
        lines.append(f"    t{e.out.index} = " + fusion.template.format(*args))
        scope.update(fusion.scope or {})
    body = (f"def fused({', '.join(f'a{i}' for i in range(len(operands)))}):\n"
            + "\n".join(lines) + f"\n    return t{step.out.index}\n")
    fused = _kernel_for(body, scope)
    members = [(e.primitive.impl, e.args, e.params, e.out.index) for e in step.eqns]
    slot_of = {a.index: i for i, a in enumerate(operands) if isinstance(a, Var)}

    # A plan's shapes never change: the call is prepared once per backend and per
    # whether it writes into a buffer (the last backend's, kept by that flag).
    launchers: dict[bool, tuple[Any, Any]] = {}

    def run(backend: Any, *arrays: Any, out: Any = None) -> Any:
        if backend.runs_plan_kernels():
            into = out is not None
            prepared = launchers.get(into)
            if prepared is None or prepared[0] is not backend:
                prepared = launchers[into] = (
                    backend, backend.launch_elementwise(fused, arrays, out))
            return prepared[1](*arrays, out=out)
        # The backend's own ops: the members one by one.
        values = {index: arrays[i] for index, i in slot_of.items()}
        result = None
        for impl, args, params, out in members:
            result = impl(backend, *[values[a.index] if isinstance(a, Var) else a
                                     for a in args], **params)
            values[out] = result
        return result

    step.impl, step.args, step.params = run, tuple(operands), {}


_KERNELS: dict[str, Any] = {}
_LOCK = threading.Lock()


def _kernel_for(body: str, functions: dict[str, Any]) -> Any:
    """One compiled kernel per distinct chain text, shared by every plan; `functions`
    are the scalar functions the text calls (a name stands for one function)."""
    with _LOCK:
        found = _KERNELS.get(body)
        if found is None:
            scope = {**functions, "__name__": __name__}
            exec(compile(body, f"<pullback fused chain {len(_KERNELS)}>", "exec"), scope)
            found = _KERNELS[body] = kernel(scope["fused"])
        return found
