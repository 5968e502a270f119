"""Preallocated buffers for a plan's forward steps, shared by values whose lives do
not overlap (views included).

The steps that write into a given array (fused chains, and the primitives that
declare how they write into one with `writes_into`: matmul, the window ops) get one
from the plan's arena, used on a backend whose `runs_plan_kernels()` is true:
allocated at the first call, kept across calls, and handed at lowering to one value
after another as liveness allows. A value the caller receives (a plan's result) is
never put in one, since the next call would overwrite it; a value saved for backward
gets a buffer of its own, which the next call reuses (an activation cache that stays
in place, as PyTorch's caching allocator keeps its blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..kernels.core import SUPPORTED_DTYPES
from .fuse import Step
from .graph import Var

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from ..ad import Primitive


@dataclass(frozen=True)
class Buffer:
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    order: Literal["C", "F"] = "C"  # "F": a matrix product laid out by columns (backend.gemm)

    def allocate(self) -> NDArray[Any]:
        return np.empty(self.shape, self.dtype, order=self.order)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def _into(prim: Primitive) -> Callable[..., Any]:
    """A step of `prim` writing into `out` on a backend that runs plan kernels; any other
    backend (a subclass that may override the op included) runs the primitive's own
    implementation, through its own ops."""
    write, impl = prim.into, prim.impl
    assert write is not None  # `writer` checked that it declares one

    def run(backend: Any, *args: Any, out: Any = None, **params: Any) -> Any:
        if out is not None and backend.runs_plan_kernels():
            return write(backend, *args, out=out, **params)
        return impl(backend, *args, **params)

    return run


def writer(step: Step) -> Callable[..., Any] | None:
    """The step's implementation taking `out=` (a buffer to write its result into), or
    None when it cannot take one."""
    if step.out.dtype not in SUPPORTED_DTYPES or not step.out.shape:
        return None
    if step.fused:
        return step.impl
    eqn = step.eqns[0]
    if eqn.param_vars or eqn.primitive.into is None or not all(
            isinstance(a, Var) and a.dtype == step.out.dtype for a in eqn.args):
        return None
    return _into(eqn.primitive)


def _aliased(steps: list[Step]) -> dict[int, set[int]]:
    """Per value, the other values that may be views of it: through any chain of steps
    whose primitive is not "fresh" (reshape, transpose, getitem, astype, a custom op...
    may return a view of an operand, which would outlive the operand's own last use)."""
    roots: dict[int, set[int]] = {}  # value -> the earlier values it may view
    for step in steps:
        if step.fused or step.eqns[0].primitive.aliasing == "fresh":
            continue
        viewed: set[int] = set()
        for a in step.args:
            if isinstance(a, Var):
                viewed |= {a.index} | roots.get(a.index, set())
        roots[step.out.index] = viewed
    views: dict[int, set[int]] = {}
    for value, viewed in roots.items():
        for v in viewed:
            views.setdefault(v, set()).add(value)
    return views


def _by_columns(step: Step, fortran: set[int]) -> bool:
    """Whether a step's result comes laid out by columns: as its primitive's `layout`
    says (a 2-D matrix product BLAS computes faster so), or for a fused chain when its
    every whole-shape operand is (its kernel then runs on their transposes and writes
    the same way)."""
    shape = step.out.shape
    if len(shape) != 2:
        return False
    if step.fused and not step.epilogue:
        whole = [a for a in step.args if isinstance(a, Var) and a.shape == shape]
        return bool(whole) and all(a.index in fortran for a in whole)
    eqn = step.eqns[0]
    layout = eqn.primitive.layout
    return (layout is not None and all(isinstance(a, Var) for a in eqn.args)
            and layout(*eqn.args) == "F")


def assign(steps: list[Step], frees: list[tuple[int, ...]], saved: set[int],
           results: set[int]) -> tuple[dict[int, int], list[Buffer], set[int]]:
    """Per step result (by value index), its buffer; the buffers; and the values laid
    out by columns (buffered or not). `frees[i]` are the
    values step i reads last; a saved value keeps its buffer for backward. A value
    that something may view keeps its buffer to itself for good (its views may live
    on), and gets none if a view of it is a result (the caller would hold it)."""
    owner: dict[int, int] = {}
    buffers: list[Buffer] = []
    idle: dict[Buffer, list[int]] = {}
    views = _aliased(steps)
    pinned = set(saved) | {v for v, seen in views.items() if seen}
    fortran: set[int] = set()  # values laid out by columns
    for step, done in zip(steps, frees):
        out = step.out
        if _by_columns(step, fortran):
            fortran.add(out.index)
        if writer(step) is not None and out.index not in results and not views.get(
                out.index, set()) & results:
            kind = Buffer(out.shape, out.dtype, "F" if out.index in fortran else "C")
            pool = idle.get(kind)
            if pool:
                owner[out.index] = pool.pop()
            else:
                owner[out.index] = len(buffers)
                buffers.append(kind)
        # The step has read its operands; what they were last read here is free again.
        for index in done:  # (never a saved or viewed value: read later, maybe)
            b = owner.get(index)
            if b is not None and index not in pinned:
                idle.setdefault(buffers[b], []).append(b)
    return owner, buffers, fortran
