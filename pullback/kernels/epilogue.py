"""A convolution's epilogue: a bias, a scale and a shift per channel, a residual, ReLU,
applied in one pass to the rows (samples, channels, pixels) a convolution has just
written, while they are still in cache, instead of one pass over memory per elementwise
op afterwards.

One body for every combination (flags choose at run time), compiled per dtype: one
compile per dtype, shared by every convolution. The order of operations is the
unfused ops' own, `relu(((y + bias) * scale + shift) + residual)` (a convolution's
bias, then a batch norm's affine map), so results are bit for bit theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pullback.errors import KernelError
from pullback.kernels import jit
from pullback.kernels.base import _SUPPORTED, SUPPORTED_DTYPES


def finished(v, bias, scale, shift, added, has_bias, has_scale, has_shift, has_residual,
             relu, zero):
    """One output value v after the epilogue: + bias, * scale, + shift, + added (the
    residual's value), each when its flag is set, then relu (NaN stays NaN, as the relu
    primitive). Inlined where compiled (pullback.kernels.products' tiles use it too)."""
    if has_bias:
        v = v + bias
    if has_scale:
        v = v * scale
    if has_shift:
        v = v + shift
    if has_residual:
        v = v + added
    if relu:
        v = zero if v <= zero else v
    return v


def epilogue_body(rows, bias, scale, shift, residual, has_bias, has_scale, has_shift,
                  has_residual, relu, zero, c0, c1):
    """rows (m, C, P) in place, channels c0 to c1: `finished` with bias[c], scale[c],
    shift[c] and residual (m, C, P)."""
    m_, _, p_ = rows.shape
    for n in range(m_):
        for c in range(c0, c1):
            b = bias[c] if has_bias else zero
            a = scale[c] if has_scale else zero
            t = shift[c] if has_shift else zero
            for p in range(p_):
                added = residual[n, c, p] if has_residual else zero
                rows[n, c, p] = finished(rows[n, c, p], b, a, t, added, has_bias, has_scale,
                                         has_shift, has_residual, relu, zero)


def epilogue_parts(rows, bias, scale, shift, residual, has_bias, has_scale, has_shift,
                   has_residual, relu, zero, parts):
    """epilogue_body on every channel, cut into `parts` parts run at once on Numba's
    threads: each channel's values are its own, whichever thread runs it."""
    c_ = rows.shape[1]
    for t in prange(parts):
        serial(rows, bias, scale, shift, residual, has_bias, has_scale, has_shift,
               has_residual, relu, zero, c_ * t // parts, c_ * (t + 1) // parts)


# In plain Python a parts driver runs its body's parts in turn; compiled, prange is
# numba.prange and `serial` the body's compiled kernel.
prange, serial = range, epilogue_body


def _signature(dtype: np.dtype) -> tuple:
    nb = jit.numba()
    vector = jit.array_type(dtype, 1, "C", readonly=True)
    return (jit.array_type(dtype, 3, "C"), vector, vector, vector,
            jit.array_type(dtype, 3, "C", readonly=True), *(nb.types.boolean,) * 5,
            nb.from_dtype(dtype))


def bound(fn: Callable) -> Callable:
    """fn (a kernel body calling `finished`) with `finished` compiled, inlined."""
    nb = jit.numba()
    inline = nb.njit(inline="always", **jit.JIT_OPTIONS)(finished)
    return jit.rebound(fn, dict(fn.__globals__, finished=inline))


def _make(dtype: np.dtype) -> tuple[Callable, tuple]:
    return bound(epilogue_body), (*_signature(dtype), jit.numba().int64, jit.numba().int64)


def _kernel(dtype: np.dtype) -> Any:
    return jit.compiled_once((epilogue_body, dtype), _make, dtype)


def _make_parts(dtype: np.dtype) -> tuple[Callable, tuple]:
    nb = jit.numba()
    driver = jit.rebound(epilogue_parts, dict(epilogue_parts.__globals__,
                                              serial=_kernel(dtype), prange=nb.prange))
    driver.__qualname__ = f"epilogue_parts_{dtype.name}"
    return driver, (*_signature(dtype), nb.int64)


def _parts_kernel(dtype: np.dtype) -> Any:
    return jit.compiled_once((epilogue_parts, dtype), _make_parts, dtype, parallel=True)


def apply(rows: np.ndarray, bias: np.ndarray | None, scale: np.ndarray | None,
          shift: np.ndarray | None, residual: np.ndarray | None, relu: bool,
          threads: int = 1) -> np.ndarray:
    """The epilogue on `rows` (m, C, P), C-contiguous, in place: bias, scale and shift
    (C,) and residual (m, C, P), each or None; its channels over `threads` of Numba's
    threads where more than one. Returns rows."""
    dtype = rows.dtype
    if dtype not in SUPPORTED_DTYPES:
        raise KernelError("conv2d", [rows], f"unsupported dtype {dtype.name}; {_SUPPORTED}")
    none = np.empty(0, dtype)
    vectors = [none if v is None else v for v in (bias, scale, shift)]
    args = (rows, *vectors, np.empty((0, 0, 0), dtype) if residual is None else residual,
            bias is not None, scale is not None, shift is not None, residual is not None,
            bool(relu), dtype.type(0))
    parts = min(threads, rows.shape[1])
    if parts > 1:
        _parts_kernel(dtype)(*args, parts)
    else:
        _kernel(dtype)(*args, 0, rows.shape[1])
    return rows
