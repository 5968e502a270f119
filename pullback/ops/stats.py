"""Reductions built on the others: var and std (PyTorch's `correction`), the vector
norm (a primitive, for its derivative where the norm is 0), and the truth reductions
any and all (bool results, no gradient)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..ad import defjvp
from ..errors import KernelError
from .checks import declare_check, inputs, nonzero
from .elementwise import abs, astype, div, equal, mul, not_equal, pow, sign, sqrt, sub, where
from .hints import Axis, Shape, TensorLike
from .reduce import max as reduce_max
from .reduce import mean
from .reduce import min as reduce_min
from .reduce import sum as reduce_sum
from .registry import declare, dtype_of, is_float, normalize_axes, reduced_shape, shape_of

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["all", "any", "norm", "std", "var"]


def _count(x: TensorLike, axes: tuple[int, ...]) -> int:
    count = 1
    for a in axes:
        count *= shape_of(x)[a]
    return count


def var(x: TensorLike, axis: Axis = None, keepdims: bool = False, *,
        correction: float = 1) -> Tensor:
    """The variance over `axis` (None: every axis), as torch.var: the sum of squared
    deviations divided by N - correction (1: unbiased, 0: the population variance);
    where that is 0 or less the result is inf or NaN, as in PyTorch."""
    axes = normalize_axes("var", x, axis)
    if not is_float(dtype_of(x)):
        raise KernelError("var", (x,), "expected a floating dtype")
    count = _count(x, axes)
    if count == 0:
        raise KernelError("var", (x,), "var of an empty selection")
    dof = count - correction
    deviation = sub(x, mean(x, axes, keepdims=True))
    # 1 / 0 as inf: 0 * inf is NaN (no spread), anything else inf, as PyTorch divides.
    return mul(reduce_sum(mul(deviation, deviation), axes, keepdims),
               1.0 / dof if dof > 0 else math.inf)


def std(x: TensorLike, axis: Axis = None, keepdims: bool = False, *,
        correction: float = 1) -> Tensor:
    """The standard deviation: the square root of `var` with the same arguments."""
    if not is_float(dtype_of(x)):
        raise KernelError("std", (x,), "expected a floating dtype")
    return sqrt(var(x, axis, keepdims, correction=correction))


# ---------------------------------------------------------------- norm


def _norm_shape(x: Any, p: float, axes: tuple[int, ...], keepdims: bool) -> tuple[Shape, Any]:
    if not is_float(dtype_of(x)):
        raise KernelError("norm", (x,), "expected a floating dtype")
    return reduced_shape(shape_of(x), axes, keepdims), dtype_of(x)


def _norm_impl(backend: Any, x: Any, p: float, axes: tuple[int, ...], keepdims: bool) -> Any:
    if p == 2:
        return backend.sqrt(backend.reduce_sum(backend.mul(x, x), axes, keepdims))
    if p == 1:
        return backend.reduce_sum(backend.abs(x), axes, keepdims)
    powered = backend.pow(backend.abs(x), float(p))
    return backend.pow(backend.reduce_sum(powered, axes, keepdims), 1.0 / p)


norm_p = declare("norm", _norm_impl, _norm_shape, saves_inputs=True, saves_output=True,
                 aliasing="fresh")


def _norm_jvp(t: Any, out: Any, x: Any, p: float, axes: tuple[int, ...], keepdims: bool) -> Any:
    """d|x|_p = sum(t * sign(x) |x|^(p-1)) / |x|_p^(p-1), and 0 where the norm is 0 (as
    torch.linalg.vector_norm's gradient): there every x is 0, and so is the numerator."""
    if p == 1:
        return reduce_sum(mul(t, sign(x)), axes, keepdims)
    if p == 2:
        weights, scale = x, out
    else:
        weights, scale = mul(sign(x), pow(abs(x), p - 1.0)), pow(out, p - 1.0)
    return div(reduce_sum(mul(t, weights), axes, keepdims), where(equal(out, 0.0), 1.0, scale))


defjvp(norm_p, _norm_jvp)


def norm(x: TensorLike, p: float | Literal["fro"] = 2, axis: Axis = None,
         keepdims: bool = False) -> Tensor:
    """The vector p-norm over `axis` (None: every axis, the Frobenius norm of a matrix
    for p=2), as torch.linalg.vector_norm: p a number >= 1, inf or -inf ("fro" is 2).
    Where the norm is 0 its gradient is 0, as PyTorch's."""
    axes = normalize_axes("norm", x, axis)
    if p == "fro":
        p = 2
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or \
            math.isnan(p) or (p < 1 and p != -math.inf):
        raise KernelError("norm", (x,), f"p must be a number >= 1, inf or -inf (or 'fro'), "
                          f"not {p!r}")
    order = float(p)
    _norm_shape(x, order, axes, keepdims)
    if math.isinf(order):  # the largest (smallest) magnitude; ties share the gradient
        pick = reduce_max if order > 0 else reduce_min
        return pick(abs(x), axes, keepdims)
    return norm_p.bind(x, p=order, axes=axes, keepdims=keepdims)


# ---------------------------------------------------------------- any and all


def any(x: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Whether any element over `axis` (None: every axis) is nonzero (NaN counts), as
    torch.any: a bool tensor; False over an empty selection."""
    axes = normalize_axes("any", x, axis)
    hits = reduce_sum(astype(not_equal(x, 0), np.dtype(np.int64)), axes, keepdims)
    return not_equal(hits, 0)


def all(x: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Whether every element over `axis` (None: every axis) is nonzero, as torch.all: a
    bool tensor; True over an empty selection."""
    axes = normalize_axes("all", x, axis)
    misses = reduce_sum(astype(equal(x, 0), np.dtype(np.int64)), axes, keepdims)
    return equal(misses, 0)


# ---------------------------------------------------------------- samples for `pullback check`

declare_check(norm_p, lambda x: (norm(x), norm(x, 1, axis=0), norm(x, 3, axis=-1, keepdims=True)),
              inputs(nonzero(2, 3)))
