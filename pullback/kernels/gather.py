"""The scatter-add that is the transpose of `take` and `take_along_axis`, compiled with
Numba per dtype (float32, float64): out[p, idx[p, j, q], q] += values[p, j, q].

Every gather reduces to that (P, J, Q) form: P the axes before the gathered axis, J
the index positions, Q the axes after it; an index array with one entry across P or Q
(`take`'s, shared by every row and column) is read once per (p, j), and the row it
picks is added as one contiguous, vectorized run. NumPy's `np.add.at` (unbuffered, one
element at a time) and per-column `np.bincount` are both far slower at an embedding's
backward.

One file on purpose: Numba's disk cache notices an edit to a kernel's own file only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pullback.kernels import jit
from pullback.kernels.base import SUPPORTED_DTYPES


def scatter_add_body(values, idx, out):
    """out (P, K, Q) += values (P, J, Q) routed by idx (P or 1, J, Q or 1) in [-K, K)."""
    n_p, n_j, n_q = values.shape
    size = out.shape[1]
    per_row = idx.shape[0] != 1
    per_column = idx.shape[2] != 1
    for p in range(n_p):
        ip = p if per_row else 0
        for j in range(n_j):
            if per_column:
                for q in range(n_q):
                    k = idx[ip, j, q]
                    out[p, k + size if k < 0 else k, q] += values[p, j, q]
            else:
                k = idx[ip, j, 0]
                if k < 0:
                    k += size
                for q in range(n_q):  # one row of out: contiguous, vectorized
                    out[p, k, q] += values[p, j, q]


def _make(dtype: np.dtype) -> tuple[Callable, tuple]:
    return scatter_add_body, (jit.array_type(dtype, 3, "C", readonly=True),
                              jit.array_type(np.dtype(np.int64), 3, "C", readonly=True),
                              jit.array_type(dtype, 3, "C"))


def _scatter_add_loop(dtype: np.dtype) -> Any:
    return jit.compiled_once((scatter_add_body, dtype), _make, dtype)


def scatter_add(values: np.ndarray, idx: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Add `values` (P, J, Q) into `out` (P, K, Q, C-contiguous) at the rows `idx` (P or 1,
    J, Q or 1; int64, every entry in [-K, K): the caller checks, the loop does not);
    returns out. float32 and float64 only (SUPPORTED_DTYPES)."""
    if out.dtype not in SUPPORTED_DTYPES or values.dtype != out.dtype:
        raise TypeError(f"scatter_add: values {values.dtype} into {out.dtype}: the loop is "
                        "compiled for float32 and float64 alone")
    _scatter_add_loop(out.dtype)(np.ascontiguousarray(values),
                                 np.ascontiguousarray(idx, dtype=np.int64), out)
    return out
