"""Preallocated buffers for a plan's forward steps, shared by values whose lives do
not overlap (views included).

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

from ..backend import conv as window_ops
from ..backend.gemm import result_order
from ..kernels.core import SUPPORTED_DTYPES
from ..ops.conv import avg_pool2d_p, conv2d_p, max_pool2d_p
from ..ops.linalg import matmul_p
from .fuse import NUMPY_BACKENDS, Step
from .graph import Var


@dataclass(frozen=True)
class Buffer:
    shape: tuple
    dtype: np.dtype
    order: str = "C"  # "F" for a matrix product laid out by columns (backend.gemm)

    def allocate(self) -> np.ndarray:
        return np.empty(self.shape, self.dtype, order=self.order)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def matmul_into(backend: Any, a: Any, b: Any, out: Any = None) -> Any:
    """matmul writing into `out` on the NumPy backends (NumPy's matmul is theirs); any
    other backend (a subclass that may override matmul included), or operands of
    another dtype, run the backend's own matmul."""
    if out is not None and type(backend) in NUMPY_BACKENDS and a.dtype == b.dtype == out.dtype:
        return np.matmul(a, b, out=out)
    return matmul_p.impl(backend, a, b)


def _window_into(fn: Any, prim: Any) -> Any:
    """A convolution or pooling step writing into `out` on the NumPy backends (their
    window kernels, `backend/conv.py`); any other backend runs the primitive's own
    implementation (through its own ops)."""

    def run(backend: Any, *args: Any, out: Any = None, **params: Any) -> Any:
        if out is not None and type(backend) in NUMPY_BACKENDS:
            return fn(*args, **params, out=out)
        return prim.impl(backend, *args, **params)

    return run


# Primitives whose NumPy implementation can write into a given array, beside fused
# chains.
_INTO = {"matmul": matmul_into,
         "conv2d": _window_into(window_ops.conv2d, conv2d_p),
         "max_pool2d": _window_into(window_ops.max_pool2d, max_pool2d_p),
         "avg_pool2d": _window_into(window_ops.avg_pool2d, avg_pool2d_p)}


def writer(step: Step) -> Any:
    """The step's implementation taking `out=` (a buffer to write its result into), or
    None when it cannot take one."""
    if step.out.dtype not in SUPPORTED_DTYPES or not step.out.shape:
        return None
    if step.fused:
        return step.impl
    eqn = step.eqns[0]
    if eqn.param_vars or not all(isinstance(a, Var) and a.dtype == step.out.dtype
                                 for a in eqn.args):
        return None
    return _INTO.get(eqn.primitive.name)


# Primitives whose result never shares memory with an operand. Any other (reshape,
# transpose, getitem, astype, a custom op...) may return a view of one, which would
# outlive the operand's own last use: see `_aliased`.
FRESH = frozenset({
    "add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "abs", "sign", "relu",
    "sigmoid", "tanh", "silu", "softplus", "erf", "gelu", "maximum", "minimum", "clip", "where",
    "equal", "not_equal", "greater", "greater_equal", "less", "less_equal", "matmul",
    "conv2d", "unfold2d", "fold2d", "max_pool2d", "avg_pool2d", "pad2d", "softmax",
    "log_softmax", "sum", "max", "cross_entropy", "layer_norm", "concatenate", "scatter_add",
    "one_hot", "dropout_mask",
})


def _aliased(steps: list[Step]) -> dict[int, set[int]]:
    """Per value, the other values that may be views of it (through any chain of steps
    not in FRESH)."""
    roots: dict[int, set[int]] = {}  # value -> the earlier values it may view
    for step in steps:
        if step.fused or step.eqns[0].primitive.name in FRESH:
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
    """Whether a step's result comes laid out by columns: a 2-D matrix product the NumPy
    backends compute so (backend.gemm), or a fused chain whose every whole-shape
    operand is (its kernel then runs on their transposes and writes the same way)."""
    shape = step.out.shape
    if len(shape) != 2:
        return False
    if step.fused:
        whole = [a for a in step.args if isinstance(a, Var) and a.shape == shape]
        return bool(whole) and all(a.index in fortran for a in whole)
    eqn = step.eqns[0]
    return (eqn.primitive.name == "matmul" and len(eqn.args) == 2
            and all(isinstance(a, Var) and len(a.shape) == 2 for a in eqn.args)
            and result_order(*shape) == "F")


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
