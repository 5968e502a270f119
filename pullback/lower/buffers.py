"""Preallocated buffers for a plan's forward steps, shared by values whose lives do
not overlap.

The steps that write into a given array (fused chains, and matmul on CPU backends)
get one from the plan's arena: allocated at the first call, kept across calls, and
handed at lowering to one value after another as liveness allows. A value the
caller receives (a plan's result) is never put in one, since the next call would
overwrite it; a value saved for backward gets a buffer of its own, which the next
call reuses (an activation cache that stays in place, as PyTorch's caching
allocator keeps its blocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend.cpu import CpuBackend
from ..kernels.core import SUPPORTED_DTYPES
from .fuse import Step
from .graph import Var


@dataclass(frozen=True)
class Buffer:
    shape: tuple
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def matmul_into(backend: Any, a: Any, b: Any, out: Any = None) -> Any:
    """matmul writing into `out` on CPU backends (NumPy's matmul is theirs); any other
    backend, or operands of another dtype, run the backend's own matmul."""
    if out is not None and isinstance(backend, CpuBackend) and a.dtype == b.dtype == out.dtype:
        return np.matmul(a, b, out=out)
    from ..ops.linalg import _matmul_impl

    return _matmul_impl(backend, a, b)


def writes_into(step: Step) -> bool:
    """Whether a step can write its result into a buffer it is given."""
    if step.out.dtype not in SUPPORTED_DTYPES or not step.out.shape:
        return False
    if step.fused:
        return True
    eqn = step.eqns[0]
    return eqn.primitive.name == "matmul" and all(
        isinstance(a, Var) and a.dtype == step.out.dtype for a in eqn.args)


def assign(steps: list[Step], frees: list[tuple[int, ...]], saved: set[int],
           results: set[int]) -> tuple[dict[int, int], list[Buffer]]:
    """Per step result (by value index), its buffer; and the buffers. `frees[i]` are the
    values step i reads last; a saved value keeps its buffer for backward."""
    owner: dict[int, int] = {}
    buffers: list[Buffer] = []
    idle: dict[Buffer, list[int]] = {}
    for step, done in zip(steps, frees):
        out = step.out
        if writes_into(step) and out.index not in results:
            kind = Buffer(out.shape, out.dtype)
            pool = idle.get(kind)
            if pool:
                owner[out.index] = pool.pop()
            else:
                owner[out.index] = len(buffers)
                buffers.append(kind)
        # The step has read its operands; what they were last read here is free again.
        for index in done:  # (never a saved value: backward reads those later)
            b = owner.get(index)
            if b is not None and index not in saved:
                idle.setdefault(buffers[b], []).append(b)
    return owner, buffers
