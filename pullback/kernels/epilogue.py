"""A convolution's epilogue: scale and bias per channel, a residual, ReLU, applied in one pass to
the rows (samples, channels, pixels) a convolution has just written, while they are
still in cache, instead of one pass over memory per elementwise op afterwards.

One body for every combination (flags choose at run time), compiled per dtype: one
compile per dtype, shared by every convolution. The order of operations is the
unfused ops' own, `relu((y * scale + bias) + residual)`, so results are bit for bit
theirs.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from pullback.errors import KernelError
from pullback.kernels import jit
from pullback.kernels.base import _SUPPORTED, SUPPORTED_DTYPES


def epilogue_body(rows, scale, bias, residual, has_scale, has_bias, has_residual, relu,
                  zero):
    """rows (m, C, P) in place: * scale[c] when has_scale, + bias[c] when has_bias,
    + residual (m, C, P) when has_residual, then relu (NaN stays NaN, as the relu
    primitive) when relu."""
    m_, c_, p_ = rows.shape
    for n in range(m_):
        for c in range(c_):
            a = scale[c] if has_scale else zero
            b = bias[c] if has_bias else zero
            for p in range(p_):
                v = rows[n, c, p]
                if has_scale:
                    v = v * a
                if has_bias:
                    v = v + b
                if has_residual:
                    v = v + residual[n, c, p]
                if relu:
                    v = zero if v <= zero else v
                rows[n, c, p] = v


_lock = threading.Lock()
_compiled: dict[np.dtype, Any] = {}


def _kernel(dtype: np.dtype) -> Any:
    found = _compiled.get(dtype)
    if found is None:
        with _lock:
            found = _compiled.get(dtype)
            if found is None:
                nb = jit.numba()
                found = nb.njit(cache=True, **jit.JIT_OPTIONS)(epilogue_body)
                found.compile((jit.array_type(dtype, 3, "C"),
                               jit.array_type(dtype, 1, "C", readonly=True),
                               jit.array_type(dtype, 1, "C", readonly=True),
                               jit.array_type(dtype, 3, "C", readonly=True),
                               nb.types.boolean, nb.types.boolean, nb.types.boolean,
                               nb.types.boolean,
                               nb.from_dtype(dtype)))
                found.disable_compile()
                _compiled[dtype] = found
    return found


def apply(rows: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None,
          residual: np.ndarray | None, relu: bool) -> np.ndarray:
    """The epilogue on `rows` (m, C, P), C-contiguous, in place: scale and bias (C,) and
    residual (m, C, P) or None; returns rows."""
    dtype = rows.dtype
    if dtype not in SUPPORTED_DTYPES:
        raise KernelError("conv2d", [rows], f"unsupported dtype {dtype.name}; {_SUPPORTED}")
    none = np.empty(0, dtype)
    _kernel(dtype)(rows, none if scale is None else scale, none if bias is None else bias,
                   np.empty((0, 0, 0), dtype) if residual is None else residual,
                   scale is not None, bias is not None, residual is not None, bool(relu),
                   dtype.type(0))
    return rows
