"""`CpuBackend`: every forward op in NumPy, deterministic, plus fused backward kernels.

Elementwise work lives in module-level kernels `f(*arrays, out=...)` so that
`ThreadedCpuBackend` can run the very same code on chunks; window ops live in conv.py.
Where a one-pass Numba kernel (pullback.kernels) measured faster than the NumPy code
at both 4 and 1M float32 elements, the module-level kernel runs it for float32 and
float64 and keeps the NumPy code for other dtypes (float16, mixed dtypes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from pullback.backend import blas, conv, gemm, heap, split
from pullback.backend.attention import CpuAttentionOps
from pullback.backend.backward_ops import BackwardOps, Grads, Needed, check_matmul_backward
from pullback.backend.base import Backend, Index, Operand, Pair, Shape, check_gelu_mode
from pullback.backend.fused import FusedOps, check_channels, check_labels, check_rows
from pullback.backend.gather import CpuGatherOps
from pullback.backend.recurrent import CpuRecurrentOps
from pullback.errors import KernelError, index_error
from pullback.kernels import activations as compiled
from pullback.kernels import channels as compiled_channels
from pullback.kernels import planes as compiled_planes
from pullback.kernels import rows as compiled_rows
from pullback.kernels import scalar_math
from pullback.kernels.core import SUPPORTED_DTYPES, ElementwiseKernel, Kernel

# Python floats, not np.float64: NumPy 2 keeps f32 arrays f32 only for Python scalars.
_SQRT1_2 = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715

# erf(x) = x * P(x**2) for |x| < 2; erfc(x) = exp(-x**2) * Q(6/x - 2) for 2 <= |x| < 6
# (erf is +-1 in f64 beyond): the fits the compiled kernels use too, kept in one place.
_ERF_SERIES, _ERFC_TAIL = scalar_math.ERF_SERIES, scalar_math.ERFC_TAIL
_ERF_SERIES_SHORT, _ERFC_TAIL_SHORT = scalar_math.ERF_SERIES_F32, scalar_math.ERFC_TAIL_F32


# -- elementwise kernels: f(*arrays, out=...); out=... asks NumPy for an array, even 0-d.
# Each makes as few full-size temporaries as it can: a fresh large buffer costs page faults.


def _horner(t: np.ndarray, coeffs: tuple[float, ...], out: Any = ...) -> np.ndarray:
    acc = np.multiply(t, coeffs[0], out=out)
    for c in coeffs[1:-1]:
        acc += c
        acc *= t
    acc += coeffs[-1]
    return acc


def _flat_pick(x: np.ndarray, index: np.ndarray) -> np.ndarray:
    if x.flags.c_contiguous:
        return x.reshape(-1).take(index)
    return x[np.unravel_index(index, x.shape)]


def _flat_put(out: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    if out.flags.c_contiguous:
        out.reshape(-1).put(index, values)
    else:
        out[np.unravel_index(index, out.shape)] = values


def _erf_scaled(x: np.ndarray, scale: float, out: Any = ...) -> np.ndarray:
    """erf(scale * x) without materializing scale * x; out must not alias x."""
    wide = x.dtype.itemsize >= 8
    t = np.multiply(x, x, out=...)
    if scale != 1.0:
        t *= scale * scale
    # The few |z| >= 2 go through flat indices: boolean-mask gathers cost twice as much.
    tail = np.flatnonzero(t >= 4.0)
    tail_values = None
    if tail.size:
        zt = _flat_pick(x, tail) * scale
        az = np.abs(zt)
        q = _horner(np.divide(6.0, np.minimum(az, 6.0)) - 2.0,
                    _ERFC_TAIL if wide else _ERFC_TAIL_SHORT)
        np.multiply(az, az, out=az)
        np.negative(az, out=az)
        np.exp(az, out=az)
        az *= q
        tail_values = np.copysign(np.subtract(1.0, az, out=az), zt, out=az)
    np.minimum(t, 4.0, out=t)  # keeps the series bounded where the tail overwrites it
    out = _horner(t, _ERF_SERIES if wide else _ERF_SERIES_SHORT, out)
    out *= x
    if scale != 1.0:
        out *= scale
    if tail_values is not None:
        _flat_put(out, tail, tail_values)
    return out


def _times(upstream: np.ndarray, slope: np.ndarray, out: Any) -> np.ndarray:
    # upstream * slope, written over the fresh slope buffer when nothing else is asked for.
    if out is ... and upstream.shape == slope.shape and upstream.dtype == slope.dtype:
        out = slope
    return np.multiply(upstream, slope, out=out)


def erf_kernel(x: np.ndarray, out: Any = ...) -> np.ndarray:
    return _erf_scaled(x, 1.0, out)


def log_kernel(x: np.ndarray, out: Any = ...) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(x, out=out)


def relu_kernel(x: np.ndarray, out: Any = ...) -> np.ndarray:
    return np.maximum(x, 0, out=out)


def sigmoid_numpy(x: np.ndarray, out: Any = ...) -> np.ndarray:
    out = np.negative(x, out=out)
    # e**-x overflows to inf for very negative x, and 1 / (1 + inf) is the right 0.
    with np.errstate(over="ignore"):
        np.exp(out, out=out)
    out += 1
    return np.reciprocal(out, out=out)


def silu_numpy(x: np.ndarray, out: Any = ...) -> np.ndarray:
    out = sigmoid_numpy(x, out)
    out *= x
    return out


def softplus_numpy(x: np.ndarray, out: Any = ...) -> np.ndarray:
    # max(x, 0) + log1p(e**-|x|): no overflow, and exact in both tails.
    tail = np.abs(x, out=...)
    np.negative(tail, out=tail)
    np.exp(tail, out=tail)
    np.log1p(tail, out=tail)
    out = np.maximum(x, 0, out=out)
    out += tail
    return out


def gelu_numpy(x: np.ndarray, out: Any = ...) -> np.ndarray:
    out = _erf_scaled(x, _SQRT1_2, out)
    out += 1
    out *= x
    out *= 0.5
    return out


def gelu_tanh_numpy(x: np.ndarray, out: Any = ...) -> np.ndarray:
    inner = np.multiply(x, x, out=...)
    inner *= _GELU_CUBIC
    inner += 1
    inner *= x
    inner *= _SQRT_2_OVER_PI
    np.tanh(inner, out=inner)
    inner += 1
    out = np.multiply(x, 0.5, out=out)
    out *= inner
    return out


def relu_backward_numpy(upstream: np.ndarray, x: np.ndarray, out: Any = ...) -> np.ndarray:
    # A multiply by the mask: np.where on a random mask is ten times slower.
    return np.multiply(upstream, np.greater(x, 0), out=out)


def sigmoid_backward_numpy(upstream: np.ndarray, y: np.ndarray, out: Any = ...) -> np.ndarray:
    out = np.subtract(1, y, out=out)
    out *= y
    out *= upstream
    return out


def tanh_backward_numpy(upstream: np.ndarray, y: np.ndarray, out: Any = ...) -> np.ndarray:
    out = np.multiply(y, y, out=out)
    np.subtract(1, out, out=out)
    out *= upstream
    return out


def sqrt_backward_kernel(upstream: np.ndarray, y: np.ndarray, out: Any = ...) -> np.ndarray:
    out = np.multiply(y, 2, out=out)
    return np.divide(upstream, out, out=out)


def abs_backward_kernel(upstream: np.ndarray, x: np.ndarray, out: Any = ...) -> np.ndarray:
    return _times(upstream, np.sign(x, out=...), out)


def silu_backward_numpy(upstream: np.ndarray, x: np.ndarray, out: Any = ...) -> np.ndarray:
    s = sigmoid_numpy(x)
    slope = np.subtract(1, s, out=...)
    slope *= x
    slope += 1
    slope *= s
    return _times(upstream, slope, out)


def softplus_backward_numpy(upstream: np.ndarray, x: np.ndarray, out: Any = ...) -> np.ndarray:
    return _times(upstream, sigmoid_numpy(x), out)


def gelu_backward_numpy(upstream: np.ndarray, x: np.ndarray, out: Any = ...) -> np.ndarray:
    cdf = _erf_scaled(x, _SQRT1_2)
    cdf += 1
    cdf *= 0.5
    pdf = np.multiply(x, x, out=...)
    pdf *= -0.5
    np.exp(pdf, out=pdf)
    pdf *= _INV_SQRT_2PI
    pdf *= x
    cdf += pdf
    return _times(upstream, cdf, out)


def gelu_tanh_backward_numpy(
    upstream: np.ndarray, x: np.ndarray, out: Any = ...
) -> np.ndarray:
    x2 = np.multiply(x, x, out=...)
    t = np.multiply(x2, _GELU_CUBIC, out=...)
    t += 1
    t *= x
    t *= _SQRT_2_OVER_PI
    np.tanh(t, out=t)
    x2 *= 3 * _GELU_CUBIC  # x2 becomes d(inner)/dx
    x2 += 1
    x2 *= _SQRT_2_OVER_PI
    right = np.multiply(t, t, out=...)
    np.subtract(1, right, out=right)
    right *= x2
    right *= x
    t += 1
    t += right
    t *= 0.5
    return _times(upstream, t, out)


def softmax_numpy(x: np.ndarray, axis: int, out: Any = ...) -> np.ndarray:
    out = np.subtract(x, np.max(x, axis=axis, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= np.sum(out, axis=axis, keepdims=True)
    return out


def log_softmax_numpy(x: np.ndarray, axis: int, out: Any = ...) -> np.ndarray:
    out = np.subtract(x, np.max(x, axis=axis, keepdims=True), out=out)
    total = np.sum(np.exp(out), axis=axis, keepdims=True)
    out -= np.log(total, out=total)
    return out


def softmax_backward_numpy(
    upstream: np.ndarray, y: np.ndarray, axis: int, out: Any = ...
) -> np.ndarray:
    dot = np.sum(np.multiply(upstream, y), axis=axis, keepdims=True)
    out = np.subtract(upstream, dot, out=out)
    out *= y
    return out


def log_softmax_backward_numpy(
    upstream: np.ndarray, y: np.ndarray, axis: int, out: Any = ...
) -> np.ndarray:
    total = np.sum(upstream, axis=axis, keepdims=True)
    e = np.exp(y)
    e *= total
    return np.subtract(upstream, e, out=out)


# -- compiled kernels, where they measured faster than the NumPy code above ---------------
# (4 and 1M float32 elements; rows of 1024 for the row-wise ones). Every one of these won
# at both sizes; relu, exp, tanh, log, sqrt and abs stay single NumPy ufuncs.


_COMPILED_DTYPES = frozenset(SUPPORTED_DTYPES)

# Batch norm's plane kernels (forward, statistics, backward) cut their channels into
# one part per BLAS thread from this many elements (split.over_parts): several passes a
# channel, their sums' latency more than memory's bandwidth bounds them. ResNet-20's
# training step (maps of 2**18 to 2**20 elements) took 7.6 and 9.5 ms less (paired, of
# 150-180); below, a part saves less than handing it over costs (2**16 elements: no
# gain; 2**15: 2x slower). Relu's backward, one pass bound by memory, stays whole.
SPLIT_NORM = 1 << 18


def _elementwise(kernel: Kernel, numpy_version: Callable) -> Callable:
    """f(*arrays, out=...): `kernel` on the calling thread where the arrays share a dtype
    the kernels compile for, `numpy_version` otherwise (float16, mixed dtypes)."""

    def run(*arrays: np.ndarray, out: Any = ...) -> np.ndarray:
        # One or two arrays here; spelled out, as a generator would cost more than the op.
        dtype = arrays[0].dtype
        if dtype in _COMPILED_DTYPES and (len(arrays) == 1 or arrays[1].dtype is dtype):
            return kernel.serial(*arrays) if out is ... else kernel.serial(*arrays, out=out)
        return numpy_version(*arrays, out=out)

    run.__name__ = run.__qualname__ = f"{kernel.name}_kernel"
    return run


def _last_axis(kernel: Kernel, numpy_version: Callable) -> Callable:
    """f(*arrays, axis, out=...): the row kernel where `axis` is the last one (rows are
    contiguous there) and the arrays share a compiled dtype and shape, NumPy otherwise
    (other axes, empty arrays: NumPy's own reductions and error messages)."""

    def run(*args: Any, out: Any = ...) -> np.ndarray:
        *arrays, axis = args
        x = arrays[-1]
        dtype = x.dtype
        if (x.ndim and axis in (-1, x.ndim - 1) and x.size and dtype in _COMPILED_DTYPES
                and all(a.dtype is dtype and a.shape == x.shape for a in arrays)):
            return kernel.serial(*arrays) if out is ... else kernel.serial(*arrays, out=out)
        return numpy_version(*arrays, axis, out=out)

    run.__name__ = run.__qualname__ = f"{kernel.name}_kernel"
    return run


sigmoid_kernel = _elementwise(compiled.sigmoid, sigmoid_numpy)
silu_kernel = _elementwise(compiled.silu, silu_numpy)
softplus_kernel = _elementwise(compiled.softplus, softplus_numpy)
gelu_kernel = _elementwise(compiled.gelu, gelu_numpy)
gelu_tanh_kernel = _elementwise(compiled.gelu_tanh, gelu_tanh_numpy)
# relu's backward: one pass instead of a mask then a multiply (0.33 -> 0.16 ms per
# million float32).
relu_backward_kernel = _elementwise(compiled.relu_backward, relu_backward_numpy)
sigmoid_backward_kernel = _elementwise(compiled.sigmoid_backward, sigmoid_backward_numpy)
tanh_backward_kernel = _elementwise(compiled.tanh_backward, tanh_backward_numpy)
silu_backward_kernel = _elementwise(compiled.silu_backward, silu_backward_numpy)
softplus_backward_kernel = _elementwise(compiled.softplus_backward, softplus_backward_numpy)
gelu_backward_kernel = _elementwise(compiled.gelu_backward, gelu_backward_numpy)
gelu_tanh_backward_kernel = _elementwise(compiled.gelu_tanh_backward, gelu_tanh_backward_numpy)
softmax_kernel = _last_axis(compiled_rows.softmax, softmax_numpy)
log_softmax_kernel = _last_axis(compiled_rows.log_softmax, log_softmax_numpy)
softmax_backward_kernel = _last_axis(compiled_rows.softmax_backward, softmax_backward_numpy)
log_softmax_backward_kernel = _last_axis(compiled_rows.log_softmax_backward,
                                         log_softmax_backward_numpy)


def cumsum_kernel(x: np.ndarray, axis: int, reverse: bool, out: Any = None) -> np.ndarray:
    """Running sums along axis, into `out` when given; from the end when `reverse`: the
    running sums of the reversed axis, written back reversed."""
    if out is None:  # laid out by rows, as plans take every result without a layout
        out = np.empty(x.shape, np.cumsum(x[(slice(0, 0),) * x.ndim], axis=axis).dtype)
    if not reverse:
        return np.cumsum(x, axis=axis, out=out)
    flip = (slice(None),) * axis + (slice(None, None, -1),)
    np.cumsum(x[flip], axis=axis, out=out[flip])
    return out


# -- method factories: one NumPy call behind one check, errors translated --------------------


def float_check(op: str, x: Any) -> None:
    if x.dtype.kind != "f":
        raise KernelError(op, [x], "expected a floating dtype")


def binary_error(op: str, a: Any, b: Any, exc: Exception) -> KernelError:
    try:
        np.broadcast_shapes(np.shape(a), np.shape(b))
    except ValueError:
        return KernelError(op, [a, b], "shapes cannot be broadcast together")
    return KernelError(op, [a, b], f"operands rejected: {exc}")


# A forward op that a factory below makes (the Backend method of the same name).
Method = Callable[..., np.ndarray]


def _named(op: str, method: Method) -> Method:
    method.__name__ = method.__qualname__ = op
    method.__doc__ = getattr(Backend, op).__doc__
    return method


def _float_unary(op: str, kernel: Callable[..., np.ndarray], costly: bool = False) -> Method:
    # `costly`: a transcendental function, 0.8 ns or more an element on one core, split
    # over the cores when large (split.costly_elementwise).
    def method(self: Backend, x: np.ndarray) -> np.ndarray:
        if x.dtype.kind != "f":
            raise KernelError(op, [x], "expected a floating dtype")
        if costly:
            return split.costly_elementwise(kernel, x)
        return kernel(x, out=...)

    return _named(op, method)


def _any_unary(op: str, ufunc: np.ufunc) -> Method:
    def method(self: Backend, x: np.ndarray) -> np.ndarray:
        try:
            return ufunc(x, out=...)
        except TypeError:
            raise KernelError(op, [x], f"unsupported dtype {x.dtype}") from None

    return _named(op, method)


def _binary(op: str, ufunc: np.ufunc) -> Method:
    def method(self: Backend, a: Operand, b: Operand) -> np.ndarray:
        try:
            return ufunc(a, b, out=...)
        except (ValueError, TypeError) as exc:
            raise binary_error(op, a, b, exc) from None

    return _named(op, method)


def has_int_array(index: Any) -> bool:
    """Whether an index holds integer arrays (advanced indexing that may repeat)."""
    items = index if isinstance(index, tuple) else (index,)
    return any(
        isinstance(i, (np.ndarray, list)) and np.asarray(i).dtype.kind in "iu" for i in items
    )


def describe_index(index: Any) -> str:
    items = index if isinstance(index, tuple) else (index,)
    text = [
        f"array{tuple(i.shape)}:{i.dtype}" if isinstance(i, np.ndarray) else repr(i) for i in items
    ]
    return f"[{', '.join(text)}]"


def _matmul_reason(a: Any, b: Any) -> str:
    sa, sb = np.shape(a), np.shape(b)
    if not sa or not sb:
        return "operands must have at least one dimension"
    inner_a, inner_b = sa[-1], (sb[0] if len(sb) == 1 else sb[-2])
    if inner_a != inner_b:
        return f"inner dimensions {inner_a} and {inner_b} differ"
    return f"batch dimensions {sa[:-2]} and {sb[:-2]} cannot be broadcast together"


def _check_out(op: str, x: np.ndarray, out: np.ndarray | None) -> None:
    # A buffer a plan hands a batch norm kernel: written whole, in x's layout.
    if out is not None and (out.shape != x.shape or out.dtype != x.dtype
                            or not out.flags.c_contiguous):
        raise KernelError(op, [x, out], "out must be C-contiguous, of x's shape and dtype")


def _copied_into(out: np.ndarray | None, y: np.ndarray) -> np.ndarray:
    # y in `out` when one is given (a path whose kernel cannot write there itself).
    if out is None:
        return y
    out[...] = y
    return out


# The NumPy backends' arrays reuse freed pages rather than fault in new ones every step
# (pullback.backend.heap): set for the process once this module is imported.
heap.keep_freed_pages()


class CpuBackend(BackwardOps, FusedOps, CpuRecurrentOps, CpuGatherOps, CpuAttentionOps,
                 Backend):
    """NumPy (and Numba kernels) on the calling thread, except large convolutions,
    matrix products and attention's heads, split over BLAS's threads
    (pullback.backend.split); deterministic. f32 stays f32."""

    name = "cpu"

    def runs_plan_kernels(self) -> bool:
        # This type only: a subclass may override an op, which a plan's kernel would skip.
        return type(self) is CpuBackend

    def launch_elementwise(self, kernel: ElementwiseKernel, operands: tuple[Operand, ...],
                           out: np.ndarray | None = None) -> Callable[..., Any]:
        launch = kernel.launcher(operands, out)  # the compiled loop without the call's checks
        return kernel if launch is None else launch

    neg = _any_unary("neg", np.negative)
    abs = _any_unary("abs", np.absolute)
    sign = _any_unary("sign", np.sign)
    exp = _float_unary("exp", np.exp, costly=True)
    log = _float_unary("log", log_kernel, costly=True)
    sqrt = _float_unary("sqrt", np.sqrt)
    relu = _float_unary("relu", relu_kernel)
    sigmoid = _float_unary("sigmoid", sigmoid_kernel, costly=True)
    tanh = _float_unary("tanh", np.tanh, costly=True)
    silu = _float_unary("silu", silu_kernel, costly=True)
    softplus = _float_unary("softplus", softplus_kernel, costly=True)
    erf = _float_unary("erf", erf_kernel, costly=True)

    def gelu(self, x: np.ndarray, approximate: str = "none") -> np.ndarray:
        return split.costly_elementwise(gelu_kernel_for("gelu", x, approximate), x)

    sin = _float_unary("sin", np.sin, costly=True)
    cos = _float_unary("cos", np.cos, costly=True)

    add = _binary("add", np.add)
    sub = _binary("sub", np.subtract)
    mul = _binary("mul", np.multiply)
    div = _binary("div", np.true_divide)
    pow = _binary("pow", np.power)
    maximum = _binary("maximum", np.maximum)
    minimum = _binary("minimum", np.minimum)
    less = _binary("less", np.less)
    less_equal = _binary("less_equal", np.less_equal)
    greater = _binary("greater", np.greater)
    greater_equal = _binary("greater_equal", np.greater_equal)
    equal = _binary("equal", np.equal)
    not_equal = _binary("not_equal", np.not_equal)

    def where(self, cond: np.ndarray, a: Operand, b: Operand) -> np.ndarray:
        try:
            return np.where(cond, a, b)
        except (ValueError, TypeError):
            raise KernelError(
                "where", [cond, a, b], "shapes cannot be broadcast together"
            ) from None

    def clip(self, x: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
        if lo is None and hi is None:
            return x.copy()
        try:
            # out=... (a fresh array, even 0-d) is NumPy's, though not in its stubs' clip.
            return np.clip(x, lo, hi, out=...)  # type: ignore[call-overload]
        except (ValueError, TypeError) as exc:
            raise KernelError("clip", [x], f"cannot clip to [{lo}, {hi}]: {exc}") from None

    def astype(self, x: np.ndarray, dtype: DTypeLike) -> np.ndarray:
        try:
            return x.astype(dtype)
        except (ValueError, TypeError) as exc:
            raise KernelError("astype", [x], f"cannot convert to {dtype!r}: {exc}") from None

    def reduce_sum(self, x: np.ndarray, axes: Shape, keepdims: bool) -> np.ndarray:
        try:
            return np.add.reduce(x, axis=axes, keepdims=keepdims, out=...)
        except (ValueError, TypeError) as exc:
            raise KernelError("reduce_sum", [x], _axes_reason(x, axes, exc)) from None

    def reduce_max(self, x: np.ndarray, axes: Shape, keepdims: bool) -> np.ndarray:
        try:
            return np.maximum.reduce(x, axis=axes, keepdims=keepdims, out=...)
        except (ValueError, TypeError) as exc:
            raise KernelError("reduce_max", [x], _axes_reason(x, axes, exc)) from None

    def reduce_min(self, x: np.ndarray, axes: Shape, keepdims: bool) -> np.ndarray:
        try:
            return np.minimum.reduce(x, axis=axes, keepdims=keepdims, out=...)
        except (ValueError, TypeError) as exc:
            raise KernelError("reduce_min", [x], _axes_reason(x, axes, exc)) from None

    def reduce_prod(self, x: np.ndarray, axes: Shape, keepdims: bool) -> np.ndarray:
        try:
            return np.asarray(np.prod(x, axis=axes, keepdims=keepdims))
        except (ValueError, TypeError) as exc:
            raise KernelError("reduce_prod", [x], _axes_reason(x, axes, exc)) from None

    def argmax(self, x: np.ndarray, axis: int | None, keepdims: bool) -> np.ndarray:
        try:
            return np.asarray(np.argmax(x, axis=axis, keepdims=keepdims), np.int64)
        except (ValueError, TypeError) as exc:
            raise KernelError("argmax", [x], _axes_reason(x, axis, exc)) from None

    def argmin(self, x: np.ndarray, axis: int | None, keepdims: bool) -> np.ndarray:
        try:
            return np.asarray(np.argmin(x, axis=axis, keepdims=keepdims), np.int64)
        except (ValueError, TypeError) as exc:
            raise KernelError("argmin", [x], _axes_reason(x, axis, exc)) from None

    def argsort(self, x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
        if not 0 <= axis < x.ndim:
            raise KernelError("argsort", [x], f"axis {axis} is out of range for {x.ndim} dims")
        if not descending:
            return np.argsort(x, axis=axis, kind="stable").astype(np.int64, copy=False)
        # Descending and stable: sort the reversed axis ascending, then read the order
        # backwards (equal elements keep their first-to-last order; NaN comes first).
        n = x.shape[axis]
        flipped = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
        return (n - 1 - np.flip(flipped, axis)).astype(np.int64, copy=False)

    def cumsum(self, x: np.ndarray, axis: int, reverse: bool = False) -> np.ndarray:
        if not 0 <= axis < x.ndim:
            raise KernelError("cumsum", [x], f"axis {axis} is out of range for {x.ndim} dimensions")
        return cumsum_kernel(x, axis, reverse)

    def reshape(self, x: np.ndarray, shape: Shape) -> np.ndarray:
        try:
            return np.reshape(x, shape)
        except (ValueError, TypeError):
            raise KernelError(
                "reshape", [x], f"cannot reshape {x.size} elements into shape {tuple(shape)}"
            ) from None

    def transpose(self, x: np.ndarray, axes: Shape) -> np.ndarray:
        if len(axes) != x.ndim:
            raise KernelError("transpose", [x], f"axes {tuple(axes)} do not match {x.ndim} dims")
        try:
            return np.transpose(x, axes)
        except (ValueError, TypeError):
            raise KernelError(
                "transpose", [x], f"axes {tuple(axes)} are not a permutation of {x.ndim} dims"
            ) from None

    def broadcast_to(self, x: np.ndarray, shape: Shape) -> np.ndarray:
        try:
            return np.broadcast_to(x, shape)
        except (ValueError, TypeError):
            raise KernelError(
                "broadcast_to", [x], f"cannot broadcast to shape {tuple(shape)}"
            ) from None

    def sum_to_shape(self, x: np.ndarray, shape: Shape) -> np.ndarray:
        shape = tuple(shape)
        if x.shape == shape:
            return x  # nothing to reduce; cotangents are never written in place
        lead = x.ndim - len(shape)
        if lead < 0 or any(s not in (1, d) for s, d in zip(shape, x.shape[lead:], strict=True)):
            raise KernelError("sum_to_shape", [x], f"cannot sum to shape {shape}")
        if x.dtype in SUPPORTED_DTYPES:
            # A bias's gradient (a dense layer's, or a convolution's per channel) as GEMVs,
            # 3-7x faster than NumPy's reduction over the other axes.
            sums = gemm.bias_sums(x, shape)
            if sums is not None:
                return sums
        axes = tuple(range(lead)) + tuple(
            lead + i for i, s in enumerate(shape) if s == 1 and x.shape[lead + i] != 1
        )
        return np.reshape(self.reduce_sum(x, axes, True), shape)

    def getitem(self, x: np.ndarray, index: Index) -> np.ndarray:
        try:
            result = x[index]
        except (IndexError, ValueError, TypeError) as exc:
            reason = f"invalid index {describe_index(index)}: {exc}"
            raise index_error("getitem", [x], reason, exc) from None
        if not isinstance(result, np.ndarray):
            return np.array(result)
        return result.copy() if np.may_share_memory(result, x) else result

    def scatter_add(self, values: np.ndarray, index: Index, shape: Shape) -> np.ndarray:
        out = np.zeros(shape, dtype=values.dtype)
        try:
            if has_int_array(index):
                # Repeated indices accumulate. np.add.at indexes as `[]` does; its stub
                # names fewer index kinds.
                np.add.at(out, index, values)  # type: ignore[arg-type]
            else:
                out[index] = values
        except (IndexError, ValueError, TypeError) as exc:
            raise KernelError(
                "scatter_add", [values],
                f"cannot add at {describe_index(index)} into shape {tuple(shape)}: {exc}",
            ) from None
        return out

    def concatenate(self, arrays: list[np.ndarray] | tuple[np.ndarray, ...], axis: int
                    ) -> np.ndarray:
        try:
            return np.concatenate(arrays, axis=axis)
        except (ValueError, TypeError) as exc:
            raise KernelError(
                "concatenate", list(arrays), f"cannot join along axis {axis}: {exc}"
            ) from None

    def pad2d(self, x: np.ndarray, padding: Pair, value: float = 0.0) -> np.ndarray:
        if x.ndim < 2:
            raise KernelError("pad2d", [x], "expected at least 2 dims")
        ph, pw = conv.pair("pad2d", [x], "padding", padding, 0)
        try:
            return conv.pad(x, (ph, pw), value) if ph or pw else x.copy()
        except (ValueError, TypeError, OverflowError) as exc:
            raise KernelError("pad2d", [x], f"cannot pad with {value!r}: {exc}") from None

    def matmul(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        try:
            return gemm.matmul(a, b, out)
        except (ValueError, TypeError):
            raise KernelError("matmul", [a, b], _matmul_reason(a, b)) from None

    def conv2d(
        self, x: np.ndarray, w: np.ndarray, stride: Pair, padding: Pair,
        dilation: Pair = (1, 1), groups: int = 1, out: np.ndarray | None = None,
    ) -> np.ndarray:
        return conv.conv2d(x, w, stride, padding, dilation, groups, out=out)

    def unfold2d(
        self, x: np.ndarray, kernel: Pair, stride: Pair, padding: Pair, pad_value: float = 0.0,
        dilation: Pair = (1, 1),
    ) -> np.ndarray:
        win = conv.check_windows("unfold2d", x, kernel, stride, padding, dilation=dilation)
        conv.check_float("unfold2d", [x])
        try:
            pad_value = float(pad_value)
        except (ValueError, TypeError, OverflowError) as exc:
            raise KernelError("unfold2d", [x], f"cannot pad with {pad_value!r}: {exc}") from None
        return conv.unfold(x, win, pad_value)

    def fold2d(
        self, cols: np.ndarray, input_shape: Shape, kernel: Pair, stride: Pair, padding: Pair,
        dilation: Pair = (1, 1),
    ) -> np.ndarray:
        if cols.ndim != 6 or len(input_shape) != 4:
            raise KernelError("fold2d", [cols], "expected (N, C, kh, kw, OH, OW) windows")
        probe = np.broadcast_to(np.empty((), cols.dtype), tuple(input_shape))
        win = conv.check_windows("fold2d", probe, kernel, stride, padding, [cols], dilation)
        expected = (*input_shape[:2], *win.kernel, *win.out_hw)
        if cols.shape != expected:
            raise KernelError("fold2d", [cols], f"expected windows of shape {expected}")
        conv.check_float("fold2d", [cols])
        return conv.fold(cols, input_shape, win)

    def max_pool2d(
        self, x: np.ndarray, kernel: Pair, stride: Pair, padding: Pair, dilation: Pair = (1, 1),
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        return conv.max_pool2d(x, kernel, stride, padding, dilation, out=out)

    def avg_pool2d(self, x: np.ndarray, kernel: Pair, stride: Pair, padding: Pair,
                   out: np.ndarray | None = None) -> np.ndarray:
        return conv.avg_pool2d(x, kernel, stride, padding, out=out)

    def softmax(self, x: np.ndarray, axis: int) -> np.ndarray:
        return rowwise_op("softmax", softmax_kernel, x, axis)

    def log_softmax(self, x: np.ndarray, axis: int) -> np.ndarray:
        return rowwise_op("log_softmax", log_softmax_kernel, x, axis)

    def asarray(self, data: ArrayLike, dtype: DTypeLike | None = None) -> np.ndarray:
        try:
            return np.array(data, dtype=dtype)
        except (ValueError, TypeError) as exc:
            raise KernelError("asarray", [], f"cannot make an array: {exc}") from None

    def zeros(self, shape: Shape, dtype: DTypeLike) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    def ones(self, shape: Shape, dtype: DTypeLike) -> np.ndarray:
        return np.ones(shape, dtype=dtype)

    def full(self, shape: Shape, value: float, dtype: DTypeLike | None = None) -> np.ndarray:
        return np.full(shape, value, dtype=dtype)

    def arange(self, start: float, stop: float | None = None, step: float = 1,
               dtype: DTypeLike | None = None) -> np.ndarray:
        return np.arange(start, stop, step, dtype=dtype)

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return x

    # -- fused ops (FusedOps): Numba row kernels for float32 and float64 ------------------

    def _fused(self, kernel: Kernel, *args: Any) -> Any:
        # The calling thread; ThreadedCpuBackend lets the kernel take its parallel loop.
        return kernel.serial(*args)

    def cross_entropy(self, logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
        check_labels("cross_entropy", logits, labels)
        if logits.dtype in _COMPILED_DTYPES:
            return self._fused(compiled_rows.cross_entropy, logits, labels)
        return super().cross_entropy(logits, labels)

    def cross_entropy_backward(
        self, upstream: np.ndarray, logits: np.ndarray, labels: np.ndarray
    ) -> np.ndarray:
        check_labels("cross_entropy_backward", logits, labels)
        if np.ndim(upstream) == 0:  # one upstream for every row (a summed loss)
            upstream = np.full(logits.shape[:-1], upstream, dtype=logits.dtype)
        upstream = np.asarray(upstream)
        if (logits.dtype in _COMPILED_DTYPES and upstream.dtype is logits.dtype
                and upstream.shape == logits.shape[:-1]):
            return self._fused(compiled_rows.cross_entropy_backward, upstream, logits, labels)
        return super().cross_entropy_backward(upstream, logits, labels)

    def _rowwise_params(self, x: np.ndarray, *params: np.ndarray | None) -> bool:
        # Whether (D,) parameters (None allowed) and x (..., D) fit the row kernels.
        return (x.ndim > 0 and x.dtype in _COMPILED_DTYPES and all(
            p is None or (p.dtype is x.dtype and p.shape == x.shape[-1:]) for p in params))

    def layer_norm(
        self, x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        check_rows("layer_norm", x)
        if not self._rowwise_params(x, weight, bias):
            return super().layer_norm(x, weight, bias, eps)
        width = x.shape[-1]
        weight = np.ones(width, x.dtype) if weight is None else weight
        bias = np.zeros(width, x.dtype) if bias is None else bias
        return self._fused(compiled_rows.layer_norm, x, weight, bias, float(eps))

    def layer_norm_statistics(self, x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
        check_rows("layer_norm_statistics", x)
        if not self._rowwise_params(x):
            return super().layer_norm_statistics(x, eps)
        # One pass per row, the forward kernel's own sums: the statistics it normalized by.
        return self._fused(compiled_rows.layer_norm_statistics, x, float(eps))

    def layer_norm_backward_of_input(
        self, upstream: np.ndarray, x: np.ndarray, weight: np.ndarray | None, eps: float,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # One pass per row: its statistics (the bits layer_norm_statistics gives), then
        # its gradients, while the row is in cache.
        if not (self._rowwise_params(x, weight) and upstream.shape == x.shape
                and upstream.dtype is x.dtype):
            return super().layer_norm_backward_of_input(upstream, x, weight, eps)
        check_rows("layer_norm_backward", x)
        weight = np.ones(x.shape[-1], x.dtype) if weight is None else weight
        return self._fused(compiled_rows.layer_norm_backward_of_input, upstream, x, weight,
                           float(eps))

    def layer_norm_backward(
        self, upstream: np.ndarray, x: np.ndarray, weight: np.ndarray | None,
        mean: np.ndarray, rstd: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        grid = x.shape[:-1]
        if not (self._rowwise_params(x, weight) and upstream.shape == x.shape
                and upstream.dtype is x.dtype
                and all(s.shape == grid and s.dtype is x.dtype for s in (mean, rstd))):
            return super().layer_norm_backward(upstream, x, weight, mean, rstd)
        weight = np.ones(x.shape[-1], x.dtype) if weight is None else weight
        return self._fused(compiled_rows.layer_norm_backward, upstream, x, weight, mean, rstd)

    def _channel_params(self, x: np.ndarray, *params: np.ndarray | None) -> bool:
        # Whether (C,) parameters (None allowed) and x (N, C, ...) fit the channel kernels.
        return (x.ndim >= 2 and x.dtype in _COMPILED_DTYPES and all(
            p is None or (p.dtype is x.dtype and p.shape == x.shape[1:2]) for p in params))

    def _channel_rows(self, x: np.ndarray) -> np.ndarray:
        # (N, C) as (C, N): a channel's values as one row, for the row kernels.
        return np.ascontiguousarray(x.T)

    def _planes(self, x: np.ndarray) -> np.ndarray:
        # (N, C, *spatial) as the C-contiguous (N, C, S) the plane kernels read.
        return np.ascontiguousarray(x).reshape(x.shape[0], x.shape[1], -1)

    def _parallel_planes(self, x: np.ndarray) -> bool:
        # Whether the plane kernels spread the channels over threads (ThreadedCpuBackend).
        return False

    def _planes_over(self, x: np.ndarray) -> Any:
        # Batch norm's plane kernels' channels in parts on BLAS's threads (SPLIT_NORM).
        return split.over_parts if x.size >= SPLIT_NORM else None

    def batch_norm(
        self, x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float,
        relu: bool = False, out: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """FusedOps.batch_norm, y written into `out` (x's shape and dtype, C-ordered) when
        given: a training plan's buffer."""
        check_channels("batch_norm", x)
        _check_out("batch_norm", x, out)
        if not self._channel_params(x, weight, bias) or x.size == 0:
            y, mean, var = super().batch_norm(x, weight, bias, eps, relu)
            return _copied_into(out, y), mean, var
        channels = x.shape[1]
        weight = np.ones(channels, x.dtype) if weight is None else weight
        bias = np.zeros(channels, x.dtype) if bias is None else bias
        if x.ndim > 2:  # NCHW as it is: no copy moves the channels outermost
            planes = self._planes(x)
            y, mean, var = compiled_planes.batch_norm(
                planes, weight, bias, float(eps), self._parallel_planes(x), relu,
                None if out is None else out.reshape(planes.shape),
                self._planes_over(x))
            return (y.reshape(x.shape) if out is None else out), mean, var
        y, mean, var = self._fused(compiled_channels.batch_norm, self._channel_rows(x), weight,
                                   bias, float(eps))
        y = np.ascontiguousarray(y.T)
        return _copied_into(out, relu_kernel(y, out=y) if relu else y), mean, var

    def batch_norm_statistics(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        check_channels("batch_norm_statistics", x)
        if x.ndim < 3 or x.size == 0 or x.dtype not in SUPPORTED_DTYPES:
            return super().batch_norm_statistics(x)
        return compiled_planes.batch_norm_statistics(self._planes(x), self._parallel_planes(x),
                                                     self._planes_over(x))

    def batch_norm_backward(
        self, upstream: np.ndarray, x: np.ndarray, weight: np.ndarray | None, eps: float,
        out: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """FusedOps.batch_norm_backward, grad_x written into `out` (x's shape and dtype,
        C-ordered) when given: a training plan's cotangent buffer."""
        check_channels("batch_norm_backward", x)
        _check_out("batch_norm_backward", x, out)
        if not (self._channel_params(x, weight) and x.size and upstream.shape == x.shape
                and upstream.dtype is x.dtype):
            grad_x, grad_weight, grad_bias = super().batch_norm_backward(upstream, x, weight,
                                                                         eps)
            return _copied_into(out, grad_x), grad_weight, grad_bias
        weight = np.ones(x.shape[1], x.dtype) if weight is None else weight
        if x.ndim > 2:
            planes = self._planes(x)
            grad_x, grad_weight, grad_bias = compiled_planes.batch_norm_backward(
                self._planes(upstream), planes, weight, float(eps), self._parallel_planes(x),
                None if out is None else out.reshape(planes.shape),
                self._planes_over(x))
            return (grad_x.reshape(x.shape) if out is None else out), grad_weight, grad_bias
        grad_x, grad_weight, grad_bias = self._fused(
            compiled_channels.batch_norm_backward, self._channel_rows(upstream),
            self._channel_rows(x), weight, float(eps))
        return _copied_into(out, np.ascontiguousarray(grad_x.T)), grad_weight, grad_bias

    def matmul_epilogue(self, a: np.ndarray, b: np.ndarray, bias: np.ndarray, relu: bool,
                        residual: np.ndarray | None = None, out: np.ndarray | None = None
                        ) -> np.ndarray:
        """FusedOps.matmul_epilogue, into `out` when given: the bias, the residual (and
        relu) applied to each split part's block of the product on its thread, right
        after it. As the ops one by one otherwise (a subclass's own matmul, add or relu;
        operands the product does not take as they are)."""
        overridden = any(getattr(type(self), name) is not getattr(CpuBackend, name)
                         for name in ("matmul", "add", "relu"))
        shape = a.shape[:-1] + b.shape[1:]
        if (overridden or b.ndim != 2 or a.ndim < 2 or a.shape[-1] != b.shape[0]
                or bias.shape != (b.shape[1],) or not a.dtype == b.dtype == bias.dtype
                or a.dtype not in SUPPORTED_DTYPES
                or (out is not None and not (out.flags.c_contiguous
                                             or out.flags.f_contiguous))
                or (residual is not None and not (
                    type(residual) is np.ndarray and residual.shape == shape
                    and residual.dtype == a.dtype and residual.flags.c_contiguous))):
            return _copied_into(out, super().matmul_epilogue(a, b, bias, relu, residual))
        # The residual's rows as the product's: (rows, N), a view.
        added = None if residual is None else residual.reshape(-1, shape[-1])

        def epilogue(block: np.ndarray, rows: slice, columns: slice) -> None:
            np.add(block, bias[columns], out=block)
            if added is not None:
                np.add(block, added[rows, columns], out=block)
            if relu:
                relu_kernel(block, out=block)

        return gemm.matmul(a, b, out, epilogue)

    def conv2d_epilogue(
        self, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None,
        scale: np.ndarray | None, shift: np.ndarray | None, residual: np.ndarray | None,
        relu: bool, stride: Pair, padding: Pair, dilation: Pair = (1, 1), groups: int = 1,
        out: np.ndarray | None = None, *, constant_weights: bool = False,
    ) -> np.ndarray:
        # A subclass that overrides conv2d gets the defaults, through its own conv2d.
        if type(self).conv2d is not CpuBackend.conv2d:
            return super().conv2d_epilogue(x, w, bias, scale, shift, residual, relu, stride,
                                           padding, dilation, groups,
                                           constant_weights=constant_weights)
        win = conv.check_conv(x, w, stride, padding, dilation, groups)
        shape = (x.shape[0], w.shape[0], *win.out_hw)
        given = [a for a in (x, w, bias, scale, shift, residual) if a is not None]
        vectors: list[np.ndarray | None] = []
        for name, v in (("bias", bias), ("scale", scale), ("shift", shift)):
            if v is not None and (v.shape != shape[1:2] or v.dtype != x.dtype):
                raise KernelError("conv2d", given, f"{name} must be a ({shape[1]},) {x.dtype} "
                                                   "vector")
            vectors.append(None if v is None else np.ascontiguousarray(v))
        if residual is not None:
            if residual.shape != shape or residual.dtype != x.dtype:
                raise KernelError("conv2d", given, f"the residual must be {shape} {x.dtype}, "
                                                   "the convolution's output")
            residual = np.ascontiguousarray(residual).reshape(shape[0], shape[1], -1)

        epilogue = conv.ChannelEpilogue(vectors[0], vectors[1], vectors[2], residual, relu)
        y = conv.conv2d(x, w, stride, padding, dilation, groups, out=out, epilogue=epilogue,
                        constant_weights=constant_weights)
        if not epilogue.covered and shape[0]:
            # A convolution path that takes no epilogue: one pass after it, still right.
            epilogue(y.reshape(shape[0], shape[1], -1), 0, shape[0])
        elif sum(epilogue.covered) != shape[0]:
            raise KernelError("conv2d", given, f"the epilogue ran on {sum(epilogue.covered)} "
                                               f"of {shape[0]} samples")
        return y

    # -- fused backward kernels ------------------------------------------------------------

    def relu_backward(self, upstream: np.ndarray, forward_input: np.ndarray,
                      out: np.ndarray | None = None
                      ) -> np.ndarray:
        if out is None:
            return relu_backward_kernel(upstream, forward_input)
        return relu_backward_kernel(upstream, forward_input, out=out)

    def relu_bias_backward(self, upstream: np.ndarray, relu_output: np.ndarray,
                           bias_shape: Shape, out: np.ndarray | None = None
                           ) -> tuple[np.ndarray, np.ndarray]:
        """BackwardOps.relu_bias_backward; for (N, C, H, W) maps and a (1, C, 1, 1) bias,
        one pass per channel (pullback.kernels.planes) where relu's backward and the
        bias's sums were two."""
        y = relu_output
        if not (y.ndim == 4 and tuple(bias_shape) == (1, y.shape[1], 1, 1) and y.size
                and y.dtype in SUPPORTED_DTYPES and upstream.shape == y.shape
                and upstream.dtype is y.dtype and (out is None or out.flags.c_contiguous)):
            return super().relu_bias_backward(upstream, y, bias_shape, out)
        grad, sums = compiled_planes.relu_bias_backward(
            self._planes(upstream), self._planes(y),
            None if out is None else out.reshape(y.shape[0], y.shape[1], -1))
        return (grad.reshape(y.shape) if out is None else out), sums.reshape(bias_shape)

    def sigmoid_backward(self, upstream: np.ndarray, forward_output: np.ndarray) -> np.ndarray:
        return sigmoid_backward_kernel(upstream, forward_output)

    def tanh_backward(self, upstream: np.ndarray, forward_output: np.ndarray) -> np.ndarray:
        return tanh_backward_kernel(upstream, forward_output)

    def exp_backward(self, upstream: np.ndarray, forward_output: np.ndarray) -> np.ndarray:
        return np.multiply(upstream, forward_output, out=...)

    def log_backward(self, upstream: np.ndarray, forward_input: np.ndarray) -> np.ndarray:
        return np.divide(upstream, forward_input, out=...)

    def sqrt_backward(self, upstream: np.ndarray, forward_output: np.ndarray) -> np.ndarray:
        return sqrt_backward_kernel(upstream, forward_output)

    def abs_backward(self, upstream: np.ndarray, forward_input: np.ndarray) -> np.ndarray:
        return abs_backward_kernel(upstream, forward_input)

    def silu_backward(self, upstream: np.ndarray, forward_input: np.ndarray) -> np.ndarray:
        return split.costly_elementwise(silu_backward_kernel, upstream, forward_input)

    def softplus_backward(self, upstream: np.ndarray, forward_input: np.ndarray) -> np.ndarray:
        return split.costly_elementwise(softplus_backward_kernel, upstream, forward_input)

    def gelu_backward(
        self, upstream: np.ndarray, forward_input: np.ndarray, approximate: str = "none"
    ) -> np.ndarray:
        return split.costly_elementwise(
            gelu_backward_kernel_for(upstream, forward_input, approximate), upstream,
            forward_input)

    def softmax_backward(
        self, upstream: np.ndarray, forward_output: np.ndarray, axis: int
    ) -> np.ndarray:
        return softmax_backward_kernel(upstream, forward_output, axis)

    def log_softmax_backward(
        self, upstream: np.ndarray, forward_output: np.ndarray, axis: int
    ) -> np.ndarray:
        return log_softmax_backward_kernel(upstream, forward_output, axis)

    def reduce_sum_backward(
        self, upstream: np.ndarray, input_shape: Shape, axes: Shape, keepdims: bool
    ) -> np.ndarray:
        out = np.empty(input_shape, dtype=upstream.dtype)
        np.copyto(out, self._unreduce(upstream, input_shape, axes, keepdims))
        return out

    def reduce_max_backward(
        self, upstream: np.ndarray, forward_input: np.ndarray, forward_output: np.ndarray,
        axes: Shape, keepdims: bool,
    ) -> np.ndarray:
        shape = forward_input.shape
        mask = np.equal(forward_input, self._unreduce(forward_output, shape, axes, keepdims))
        # out=...: a 0-d input reduces to a NumPy scalar otherwise, which cannot be `out`.
        count = np.add.reduce(mask, axis=axes, keepdims=True, dtype=upstream.dtype, out=...)
        share = np.divide(self._unreduce(upstream, shape, axes, keepdims), count, out=count)
        return np.multiply(mask, share, out=...)

    def matmul_backward(
        self, upstream: np.ndarray, lhs: np.ndarray, rhs: np.ndarray,
        needed: Needed = (True, True),
    ) -> Grads:
        check_matmul_backward(upstream, lhs, rhs)
        dense = self._dense_backward(upstream, lhs, rhs, needed, None, False)
        if dense is not None:
            return dense[0], dense[1]
        a = lhs if lhs.ndim > 1 else lhs[None, :]
        b = rhs if rhs.ndim > 1 else rhs[:, None]
        u = upstream if rhs.ndim > 1 else upstream[..., None]
        if lhs.ndim == 1:
            u = u[..., None, :]
        grad_lhs = grad_rhs = None
        if needed[0]:
            full = gemm.matmul(u, np.swapaxes(b, -1, -2))
            grad_lhs = self.sum_to_shape(full, a.shape).reshape(lhs.shape)
        if needed[1]:
            if b.ndim == 2 and a.shape[:-2] == u.shape[:-2]:
                # A shared weight: one GEMM over all batch rows instead of a batch then a sum.
                # Row counts spelled out: reshape(-1, 0) of an empty operand is ambiguous.
                rows = math.prod(a.shape[:-1])
                a2, u2 = a.reshape(rows, a.shape[-1]), u.reshape(rows, u.shape[-1])
                if rhs.ndim == 2 and rhs.flags.f_contiguous and not rhs.flags.c_contiguous:
                    grad_rhs = gemm.c_product(u2.T, a2).T  # laid out as w.T (_dense_backward)
                else:
                    grad_rhs = gemm.c_product(a2.T, u2).reshape(rhs.shape)
            else:
                full = np.matmul(np.swapaxes(a, -1, -2), u)
                grad_rhs = self.sum_to_shape(full, b.shape).reshape(rhs.shape)
        return grad_lhs, grad_rhs

    def matmul_bias_backward(
        self, upstream: np.ndarray, lhs: np.ndarray, rhs: np.ndarray,
        needed: tuple[bool, bool, bool] = (True, True, True), out: np.ndarray | None = None,
    ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """BackwardOps.matmul_bias_backward; a dense layer's (`_dense_backward`) with the
        bias's column sums beside its weight gradient's product."""
        check_matmul_backward(upstream, lhs, rhs)
        dense = self._dense_backward(upstream, lhs, rhs, needed[:2], out, needed[2])
        if dense is not None:
            return dense
        return super().matmul_bias_backward(upstream, lhs, rhs, needed, out)

    def _dense_backward(
        self, upstream: np.ndarray, lhs: np.ndarray, rhs: np.ndarray, needed: Needed,
        out: np.ndarray | None, bias_needed: bool,
    ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None] | None:
        """A dense layer's gradients (x @ w.T, w a transposed view: its gradient laid out
        as it, so that transposing it back yields a C-ordered array and no strided copy
        is ever made of it), the input's into `out` when given, and with `bias_needed`
        the column sums of upstream (a bias's gradient); None for any other product.
        Each split part of the weight gradient's product (upstream^T x, a block of the
        weight's rows per column block of upstream) sums its own columns of upstream
        right after its product has read them; where both products split, each part
        computes its block of both (and of the sums) in one hand-over to the threads."""
        rows = math.prod(upstream.shape[:-1]) if upstream.ndim else 0
        if not (needed[1] and rhs.ndim == 2 and lhs.ndim >= 2
                and rhs.flags.f_contiguous and not rhs.flags.c_contiguous
                and upstream.shape == lhs.shape[:-1] + rhs.shape[-1:]
                and upstream.flags.c_contiguous and lhs.flags.c_contiguous
                and upstream.dtype == lhs.dtype == rhs.dtype
                and upstream.dtype in SUPPORTED_DTYPES and rows > 0
                and (rows <= gemm.COLUMN_SUM_ROWS or not bias_needed)):
            return None
        u2 = upstream.reshape(rows, upstream.shape[-1])
        a2 = lhs.reshape(rows, lhs.shape[-1])
        bias = np.empty(u2.shape[1], u2.dtype) if bias_needed else None
        ones = gemm.ones(rows, u2.dtype) if bias_needed else None
        if needed[0]:
            together = _both_split(u2, a2, out)
            if together is not None:
                grad_lhs, grad_rhs = together(rhs.T, ones, bias)
                return (grad_lhs if out is not None else grad_lhs.reshape(lhs.shape), grad_rhs,
                        bias)
        grad_lhs = None
        if needed[0]:
            grad_lhs = gemm.matmul(upstream, rhs.T, out)

        def sums(block: np.ndarray, part: slice, columns: slice) -> None:
            assert bias is not None and ones is not None  # only asked for with the sums
            if part == slice(None):  # not split: as sum_to_shape sums a bias
                bias[...] = self.sum_to_shape(u2, bias.shape)
            else:  # a part, on its thread (BLAS on one thread there)
                np.matmul(ones, u2[:, part], out=bias[part])

        grad_rhs = gemm.c_product(u2.T, a2, sums if bias_needed else None).T
        return grad_lhs, grad_rhs, bias

    def conv2d_input_backward(
        self, upstream: np.ndarray, weight: np.ndarray, input_shape: Shape, stride: Pair,
        padding: Pair, dilation: Pair = (1, 1), groups: int = 1, out: np.ndarray | None = None,
    ) -> np.ndarray:
        return conv.conv2d_input_backward(upstream, weight, input_shape, stride, padding,
                                          dilation, groups, out=out)

    def conv2d_weight_backward(
        self, upstream: np.ndarray, forward_input: np.ndarray, weight_shape: Shape,
        stride: Pair, padding: Pair, dilation: Pair = (1, 1), groups: int = 1,
    ) -> np.ndarray:
        return conv.conv2d_weight_backward(upstream, forward_input, weight_shape, stride,
                                           padding, dilation, groups)

    def conv2d_bias_backward(self, upstream: np.ndarray) -> np.ndarray:
        return np.add.reduce(upstream, axis=(0, 2, 3))

    def max_pool2d_backward(
        self, upstream: np.ndarray, forward_input: np.ndarray, forward_output: np.ndarray,
        kernel: Pair, stride: Pair, padding: Pair, dilation: Pair = (1, 1),
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        return conv.max_pool2d_backward(
            upstream, forward_input, forward_output, kernel, stride, padding, dilation, out=out
        )

    def avg_pool2d_backward(
        self, upstream: np.ndarray, input_shape: Shape, kernel: Pair, stride: Pair,
        padding: Pair, out: np.ndarray | None = None,
    ) -> np.ndarray:
        return conv.avg_pool2d_backward(upstream, input_shape, kernel, stride, padding, out=out)


def _both_split(u2: np.ndarray, a2: np.ndarray, out: np.ndarray | None) -> Callable | None:
    """A dense layer's input and weight gradients (u2 @ w and u2^T @ a2, and a bias's
    column sums of u2 where given one) as one split over the threads, or None where
    gemm.product would not split both products: each part takes its rows of the input
    gradient (into `out`, C-ordered, or a new array) and its rows of the weight's
    transposed gradient, the same blocks gemm.product's two splits would give them, bit
    for bit."""
    rows, width, columns = a2.shape[0], a2.shape[1], u2.shape[1]
    if rows * width * columns < gemm.SPLIT_MACS or blas.products_threaded() or (
            out is not None and not (out.shape == (rows, width) and out.flags.c_contiguous
                                     and out.dtype == u2.dtype)):
        return None
    by_rows, by_columns = split.parts(rows), split.parts(columns)
    if len(by_rows) < 2 or len(by_rows) != len(by_columns):
        return None
    grad_lhs = out if out is not None else np.empty((rows, width), u2.dtype)
    grad_rhs_t = np.empty((columns, width), u2.dtype)

    def run(w: np.ndarray, ones: np.ndarray | None, bias: np.ndarray | None) -> tuple:
        def parts(first: int, stop: int) -> None:
            for k in range(first, stop):
                (i, j), (c, d) = by_rows[k], by_columns[k]
                np.matmul(u2[i:j], w, out=grad_lhs[i:j])
                np.matmul(u2[:, c:d].T, a2, out=grad_rhs_t[c:d])
                if bias is not None and ones is not None:
                    np.matmul(ones, u2[:, c:d], out=bias[c:d])

        split.over_parts(len(by_rows), parts)
        return grad_lhs, grad_rhs_t.T

    return run


def gelu_kernel_for(op: str, x: np.ndarray, approximate: str) -> Callable:
    """The gelu kernel for `approximate`, after checking x and the mode."""
    if x.dtype.kind != "f":
        raise KernelError(op, [x], "expected a floating dtype")
    check_gelu_mode(op, [x], approximate)
    return gelu_kernel if approximate == "none" else gelu_tanh_kernel


def gelu_backward_kernel_for(upstream: np.ndarray, x: np.ndarray, approximate: str) -> Callable:
    """The gelu backward kernel for `approximate`, after checking the mode."""
    check_gelu_mode("gelu_backward", [upstream, x], approximate)
    return gelu_backward_kernel if approximate == "none" else gelu_tanh_backward_kernel


def rowwise_op(op: str, kernel: Callable, x: np.ndarray, axis: int) -> np.ndarray:
    if x.dtype.kind != "f":
        raise KernelError(op, [x], "expected a floating dtype")
    try:
        return kernel(x, axis)
    except ValueError as exc:
        raise KernelError(op, [x], _axes_reason(x, (axis,), exc)) from None


def _axes_reason(x: np.ndarray, axes: Any, exc: Exception) -> str:
    axes = axes if isinstance(axes, tuple) else (axes,)
    if any(not -x.ndim <= a < x.ndim for a in axes):
        return f"axes {axes} are out of range for {x.ndim} dims"
    if x.size == 0:
        return f"cannot reduce over an empty axis among {axes}"
    return f"cannot reduce over axes {axes}: {exc}"
