"""Compiled versions of scalar_math: branch-free and so vectorizable by LLVM.

Imported (and thereby registered with Numba) on the first kernel compilation only, so
that `import pullback` does not pay for importing Numba. Every function keeps float32
in float32 (16 lanes per AVX-512 register, as NumPy's own loops) and float64 in float64.
Branches are written as conditional expressions, which LLVM turns into selects.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from llvmlite import ir  # type: ignore[import-untyped]  # llvmlite ships no type information
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload, register_jitable

from pullback.kernels import scalar_math as sm

if TYPE_CHECKING:
    from numba.core.decorators import _JITOptions

_F32 = np.float32
# As every kernel: NumPy's float semantics (x / 0 is inf, not ZeroDivisionError), whose
# branch-free divisions LLVM can vectorize; FMA contraction where the target has it.
_JIT: _JITOptions = {"error_model": "numpy", "fastmath": {"contract"}}
# Reductions may reorder their sums (flags stay on these instructions when inlined).
_JIT_SUM: _JITOptions = {"error_model": "numpy", "fastmath": {"contract", "reassoc"}}


def _intrinsic(defn: Callable[..., Any]) -> Callable[..., Any]:
    """`numba.extending.intrinsic`, typed as jitted code calls the result: without the
    typing context that Numba passes `defn` first (Numba's stub counts it as an argument
    of the call)."""
    return intrinsic(defn)


def _f32_tuple(values: tuple[float, ...]) -> tuple[np.float32, ...]:
    return tuple(_F32(v) for v in values)


# exp: x = k ln2 + r with |r| <= ln2 / 2 (Cody-Waite split of ln2), e**r by its Taylor
# series (degree 13 / 7: under 1e-17 / 5e-9 truncation error), times 2**k built from
# exponent bits. 2**k goes in two halves so that subnormal and overflowing results
# round once, as libm's do.
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_EXP_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(13, -1, -1))
_LOG2E_F32 = _F32(_LOG2E)
_LN2_HI_F32 = _F32(0.693359375)
_LN2_LO_F32 = _F32(-2.12194440e-4)
_EXP_TAYLOR_F32 = _f32_tuple(tuple(1.0 / math.factorial(k) for k in range(7, -1, -1)))
_EXP_LIMIT = 750.0  # beyond every finite result, and small enough for the bit tricks
_EXP_LIMIT_F32 = _F32(104.0)
_SQRT1_2_F32 = _F32(sm.SQRT1_2)
_INV_SQRT_2PI_F32 = _F32(sm.INV_SQRT_2PI)


@_intrinsic
def _f64_from_bits(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@_intrinsic
def _f32_from_bits(typingctx, bits):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@_intrinsic
def _fmax(typingctx, a, b):
    # llvm.maxnum, a NaN-skipping max: the loop vectorizer makes a vector reduction of
    # it, where a compare-and-select max would stay scalar (unless NaNs are ruled out).
    if not (isinstance(a, types.Float) and a == b):
        return None

    def codegen(context, builder, signature, args):
        lty = args[0].type
        name = f"llvm.maxnum.{'f32' if lty == ir.FloatType() else 'f64'}"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(lty, [lty, lty]), name)
        return builder.call(fn, args)

    return a(a, b), codegen


def _polynomial(coeffs: tuple, name: str) -> Callable:
    """A jitable `p(t)` with the coefficients (highest power first) written out as
    literals: a loop over a tuple would stay a loop, and an inner loop stops LLVM from
    vectorizing the element loop around it."""
    literal = (lambda c: f"_F32({c!r})") if isinstance(coeffs[0], np.float32) else repr
    body = literal(float(coeffs[0]))
    for c in coeffs[1:]:
        body = f"({body}) * t + {literal(float(c))}"
    scope: dict = {"_F32": _F32}
    exec(f"def {name}(t):\n    return {body}\n", scope)
    return register_jitable(**_JIT)(scope[name])


_exp_series = _polynomial(_EXP_TAYLOR, "_exp_series")
_exp_series_f32 = _polynomial(_EXP_TAYLOR_F32, "_exp_series_f32")
_tanh_series = _polynomial(sm.TANH_SERIES, "_tanh_series")
_tanh_series_f32 = _polynomial(_f32_tuple(sm.TANH_SERIES_F32), "_tanh_series_f32")
_erf_series = _polynomial(sm.ERF_SERIES, "_erf_series")
_erf_series_f32 = _polynomial(_f32_tuple(sm.ERF_SERIES_F32), "_erf_series_f32")
_erfc_tail = _polynomial(sm.ERFC_TAIL, "_erfc_tail")
_erfc_tail_f32 = _polynomial(_f32_tuple(sm.ERFC_TAIL_F32), "_erfc_tail_f32")
_atanh_series = _polynomial(sm.ATANH_SERIES, "_atanh_series")
_atanh_series_f32 = _polynomial(_f32_tuple(sm.ATANH_SERIES_F32), "_atanh_series_f32")


@register_jitable(**_JIT)
def _exp64(x):
    xc = _EXP_LIMIT if x > _EXP_LIMIT else x  # NaN falls through both clamps
    xc = -_EXP_LIMIT if xc < -_EXP_LIMIT else xc
    k = np.floor(xc * _LOG2E + 0.5)
    r = (xc - k * _LN2_HI) - k * _LN2_LO
    k = k if k == k else 0.0  # a NaN k would make the int conversion undefined
    n = np.int64(k)
    half = n >> 1
    low = _f64_from_bits((half + 1023) << 52)
    high = _f64_from_bits((n - half + 1023) << 52)
    return _exp_series(r) * low * high


@register_jitable(**_JIT)
def _exp32(x):
    xc = _EXP_LIMIT_F32 if x > _EXP_LIMIT_F32 else x
    xc = -_EXP_LIMIT_F32 if xc < -_EXP_LIMIT_F32 else xc
    k = np.floor(xc * _LOG2E_F32 + _F32(0.5))
    r = (xc - k * _LN2_HI_F32) - k * _LN2_LO_F32
    k = k if k == k else _F32(0.0)
    n = np.int32(k)
    half = n >> 1
    low = _f32_from_bits(np.int32((half + 127) << 23))
    high = _f32_from_bits(np.int32((n - half + 127) << 23))
    return _exp_series_f32(r) * low * high


@register_jitable(**_JIT)
def _tanh64(x):
    a = abs(x)
    small = x * _tanh_series(x * x)
    big = np.copysign(1.0 - 2.0 / (_exp64(2.0 * a) + 1.0), x)
    return small if a < sm.TANH_SERIES_LIMIT else big


@register_jitable(**_JIT)
def _tanh32(x):
    a = abs(x)
    small = x * _tanh_series_f32(x * x)
    big = np.copysign(_F32(1.0) - _F32(2.0) / (_exp32(_F32(2.0) * a) + _F32(1.0)), x)
    return small if a < _F32(sm.TANH_SERIES_LIMIT) else big


# erf = x P(x**2) below |x| = 2, 1 - e**-x**2 Q(6/|x| - 2) from there (as CpuBackend),
# from x, t = x**2 and e = e**-t: the normal distribution's density shares that e.
@register_jitable(inline="always", **_JIT)
def _erf_given64(x, t, e):
    series = x * _erf_series(min(t, 4.0))
    a = min(max(abs(x), 2.0), 6.0)
    tail = np.copysign(1.0 - e * _erfc_tail(6.0 / a - 2.0), x)
    return series if t < 4.0 else tail


@register_jitable(inline="always", **_JIT)
def _erf_given32(x, t, e):
    series = x * _erf_series_f32(min(t, _F32(4.0)))
    a = min(max(abs(x), _F32(2.0)), _F32(6.0))
    tail = np.copysign(_F32(1.0) - e * _erfc_tail_f32(_F32(6.0) / a - _F32(2.0)), x)
    return series if t < _F32(4.0) else tail


@register_jitable(inline="always", **_JIT)
def _erf64(x):
    t = x * x
    return _erf_given64(x, t, _exp64(-t))


@register_jitable(inline="always", **_JIT)
def _erf32(x):
    t = x * x
    return _erf_given32(x, t, _exp32(-t))


# Phi and phi: erf at z = x / sqrt 2, whose e**(-z*z) is the density's e**(-x*x/2).
@register_jitable(inline="always", **_JIT)
def _normal_cdf_pdf64(x):
    z = x * sm.SQRT1_2
    t = z * z
    e = _exp64(-t)
    return 0.5 * (1.0 + _erf_given64(z, t, e)), sm.INV_SQRT_2PI * e


@register_jitable(inline="always", **_JIT)
def _normal_cdf_pdf32(x):
    z = x * _SQRT1_2_F32
    t = z * z
    e = _exp32(-t)
    return _F32(0.5) * (_F32(1.0) + _erf_given32(z, t, e)), _INV_SQRT_2PI_F32 * e


@register_jitable(**_JIT)
def _softplus64(x):
    # log1p(z) = 2 atanh(s), s = z / (2 + z); written z * (...) so tiny z stays exact.
    z = _exp64(-abs(x))
    s = z / (2.0 + z)
    return (x if x > 0.0 else 0.0) + z * (2.0 / (2.0 + z)) * _atanh_series(s * s)


@register_jitable(**_JIT)
def _softplus32(x):
    z = _exp32(-abs(x))
    s = z / (_F32(2.0) + z)
    tail = z * (_F32(2.0) / (_F32(2.0) + z)) * _atanh_series_f32(s * s)
    return (x if x > _F32(0.0) else _F32(0.0)) + tail


@register_jitable(**_JIT)
def _sigmoid64(x):
    # One exp of -|x|, then the form that cannot overflow for each sign.
    z = _exp64(-abs(x))
    s = 1.0 / (1.0 + z)
    return s if x >= 0.0 else z * s


@register_jitable(**_JIT)
def _sigmoid32(x):
    z = _exp32(-abs(x))
    s = _F32(1.0) / (_F32(1.0) + z)
    return s if x >= _F32(0.0) else z * s


def _pick(f32_impl: Callable, f64_impl: Callable) -> Callable:
    """An overload typer: the float32 version for float32, float64 for other numbers."""

    # No annotations: Numba compares the typer's parameters with the implementation's.
    def typer(x):
        if x == types.float32:
            return lambda x: f32_impl(x)
        if isinstance(x, (types.Float, types.Integer, types.Boolean)):
            return lambda x: f64_impl(np.float64(x))
        return None

    return typer


overload(sm.exp, jit_options=_JIT)(_pick(_exp32, _exp64))
overload(sm.tanh, jit_options=_JIT)(_pick(_tanh32, _tanh64))
# erf (three polynomials and an exp) is too large for LLVM's inliner, and a call left in
# the element loop blocks vectorization (6x slower); inlining it in Numba's IR costs
# about 0.5 s of compile time per kernel and dtype.
overload(sm.erf, inline="always", jit_options=_JIT)(_pick(_erf32, _erf64))
overload(sm.normal_cdf_pdf, inline="always", jit_options=_JIT)(
    _pick(_normal_cdf_pdf32, _normal_cdf_pdf64))
overload(sm.sigmoid, jit_options=_JIT)(_pick(_sigmoid32, _sigmoid64))
overload(sm.softplus, jit_options=_JIT)(_pick(_softplus32, _softplus64))


# sin and cos compile to Numba's math.sin / math.cos: LLVM's intrinsics, the C library's
# sinf / sin (within an ulp of NumPy's), vectorized where Numba finds Intel's SVML. A
# polynomial of our own would need a careful argument reduction for large |x|.
@register_jitable(**_JIT)
def _sin(x):
    return math.sin(x)


@register_jitable(**_JIT)
def _cos(x):
    return math.cos(x)


overload(sm.sin, jit_options=_JIT)(_pick(_sin, _sin))
overload(sm.cos, jit_options=_JIT)(_pick(_cos, _cos))


@register_jitable(**_JIT)
def _row_max(row):
    largest = row.dtype.type(-np.inf)
    for j in range(row.shape[0]):
        largest = _fmax(largest, row[j])
    return largest


@register_jitable(**_JIT_SUM)
def _row_sum(row):
    total = row.dtype.type(0)
    for j in range(row.shape[0]):
        total += row[j]
    return total


@register_jitable(**_JIT_SUM)
def _row_dot(a, b):
    total = a.dtype.type(0)
    for j in range(a.shape[0]):
        total += a[j] * b[j]
    return total


@register_jitable(**_JIT_SUM)
def _row_dot3(a, b, c):
    total = a.dtype.type(0)
    for j in range(a.shape[0]):
        total += a[j] * b[j] * c[j]
    return total


@register_jitable(**_JIT_SUM)
def _row_sum_sq_dev(row, shift):
    total = row.dtype.type(0)
    for j in range(row.shape[0]):
        d = row[j] - shift
        total += d * d
    return total


@register_jitable(**_JIT_SUM)
def _row_sum_exp64(row, shift):
    total = 0.0
    for j in range(row.shape[0]):
        total += _exp64(row[j] - shift)
    return total


@register_jitable(**_JIT_SUM)
def _row_sum_exp32(row, shift):
    total = _F32(0.0)
    for j in range(row.shape[0]):
        total += _exp32(row[j] - shift)
    return total


def _float_rows(*rows: types.Type) -> bool:
    dtype = getattr(rows[0], "dtype", None)
    return all(isinstance(r, types.Array) and r.ndim == 1 and r.dtype == dtype
               and isinstance(r.dtype, types.Float) for r in rows)


# Called from row kernels as it is (its loops and the row helpers above).
register_jitable(**_JIT_SUM)(sm.layer_norm_row_grads)


@overload(sm.row_max, jit_options=_JIT)
def _ov_row_max(row):
    return (lambda row: _row_max(row)) if _float_rows(row) else None


@overload(sm.row_sum, jit_options=_JIT_SUM)
def _ov_row_sum(row):
    return (lambda row: _row_sum(row)) if _float_rows(row) else None


@overload(sm.row_dot, jit_options=_JIT_SUM)
def _ov_row_dot(a, b):
    return (lambda a, b: _row_dot(a, b)) if _float_rows(a, b) else None


@overload(sm.row_dot3, jit_options=_JIT_SUM)
def _ov_row_dot3(a, b, c):
    return (lambda a, b, c: _row_dot3(a, b, c)) if _float_rows(a, b, c) else None


@overload(sm.row_sum_sq_dev, jit_options=_JIT_SUM)
def _ov_row_sum_sq_dev(row, shift):
    if not _float_rows(row):
        return None
    if row.dtype == types.float32:
        return lambda row, shift: _row_sum_sq_dev(row, _F32(shift))
    return lambda row, shift: _row_sum_sq_dev(row, np.float64(shift))


@overload(sm.row_sum_exp, jit_options=_JIT_SUM)
def _ov_row_sum_exp(row, shift):
    if not _float_rows(row):
        return None
    if row.dtype == types.float32:
        return lambda row, shift: _row_sum_exp32(row, _F32(shift))
    return lambda row, shift: _row_sum_exp64(row, np.float64(shift))


@overload(sm.row_len, jit_options=_JIT)
def _ov_row_len(row):
    if not _float_rows(row):
        return None
    return lambda row: row.dtype.type(row.shape[0])
