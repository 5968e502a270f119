"""Reductions and row-wise normalizations: sum, max, min, prod, mean, softmax,
log_softmax, logsumexp, the running sum cumsum, and the index reductions argmax
and argmin (integer results, no gradient)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ad import Primitive, defjvp, deflinear, defvjp
from ..errors import KernelError
from .backward_defaults import backward_kernel
from .checks import declare_check, distinct, inputs, nonzero, normal
from .elementwise import astype, div, equal, exp, mul, sub, where
from .hints import Axis, Shape, TensorLike
from .registry import (
    declare,
    dtype_of,
    is_float,
    normalize_axes,
    reduced_shape,
    shape_of,
    tensor_method,
)
from .shape import broadcast_to, is_tensor, reshape

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["argmax", "argmin", "cumsum", "log_softmax", "logsumexp", "max", "mean", "min",
           "prod", "softmax", "sum"]


def _reduce_shape(op: str) -> Callable[..., tuple[Shape, Any]]:
    def rule(x: Any, axes: tuple[int, ...], keepdims: bool) -> tuple[Shape, Any]:
        return reduced_shape(shape_of(x), axes, keepdims), dtype_of(x)

    return rule


def _expand(ct: Any, shape: Shape, axes: tuple[int, ...], keepdims: bool) -> Any:
    """Broadcast a reduced value back over the reduced axes of `shape`."""
    if not keepdims:
        ct = reshape(ct, reduced_shape(shape, axes, True))
    return broadcast_to(ct, shape)


reduce_sum_p = declare(
    "sum",
    lambda backend, x, axes, keepdims: backend.reduce_sum(x, axes, keepdims),
    _reduce_shape("sum"),
    aliasing="fresh",  # axes=() copies
)
deflinear(reduce_sum_p, lambda ct, x, axes, keepdims: (_expand(ct, x.shape, axes, keepdims),))
defvjp(reduce_sum_p, lambda be, g, n: (
    be.reduce_sum_backward(g, n.in_shapes[0], n.params["axes"], n.params["keepdims"]),))


def sum(x: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """The sum over `axis` (None: every axis); `keepdims` keeps the summed axes as size 1."""
    axes = normalize_axes("sum", x, axis)
    if not axes and not keepdims and shape_of(x) != () and is_tensor(x):
        return x
    return reduce_sum_p.bind(x, axes=axes, keepdims=keepdims)


def mean(x: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """The mean over `axis` (None: every axis); refused over an empty selection."""
    axes = normalize_axes("mean", x, axis)
    count = 1
    for a in axes:
        count *= shape_of(x)[a]
    if count == 0:
        raise KernelError("mean", (x,), "mean of an empty selection")
    return mul(sum(x, axes, keepdims), 1.0 / count)


def _refuse_empty(op: str, x: Any, axes: tuple[int, ...]) -> tuple[int, ...]:
    """`axes`, unless one of them is empty: a max or min of nothing is refused (as in
    PyTorch), here where the op is named, rather than by the backend."""
    if any(shape_of(x)[a] == 0 for a in axes):
        raise KernelError(op, (x,), f"{op} of an empty selection")
    return axes


def _extremum_shape(op: str) -> Callable[..., tuple[Shape, Any]]:
    def rule(x: Any, axes: tuple[int, ...], keepdims: bool) -> tuple[Shape, Any]:
        _refuse_empty(op, x, axes)
        return reduced_shape(shape_of(x), axes, keepdims), dtype_of(x)

    return rule


reduce_max_p = declare(
    "max",
    lambda backend, x, axes, keepdims: backend.reduce_max(x, axes, keepdims),
    _extremum_shape("max"),
    saves_inputs=True,
    saves_output=True,
    aliasing="fresh",
)


def _extremum_jvp(t: Any, out: Any, x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    # Ties share the derivative equally, as torch.amax and torch.amin do.
    hits = astype(equal(x, _expand(out, shape_of(x), axes, keepdims)), dtype_of(x))
    share = div(hits, _expand(sum(hits, axes, keepdims), shape_of(x), axes, keepdims))
    return sum(mul(t, share), axes, keepdims)


def _extremum_vjp(be: Any, g: Any, n: Any) -> tuple[Any]:
    # The kernel sends upstream to the elements equal to the result, split among ties:
    # the same for a min as for a max.
    return (be.reduce_max_backward(g, n.inputs[0], n.output, n.params["axes"],
                                   n.params["keepdims"]),)


defjvp(reduce_max_p, _extremum_jvp)
defvjp(reduce_max_p, _extremum_vjp)
backward_kernel(reduce_max_p, "reduce_max_backward")


@tensor_method(reduce_max_p)
def max(x: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """The largest values over `axis` (None: every axis), as torch.amax: ties share the
    gradient equally."""
    axes = _refuse_empty("max", x, normalize_axes("max", x, axis))
    return reduce_max_p.bind(x, axes=axes, keepdims=keepdims)


reduce_min_p = declare(
    "min",
    lambda backend, x, axes, keepdims: backend.reduce_min(x, axes, keepdims),
    _extremum_shape("min"),
    saves_inputs=True,
    saves_output=True,
    aliasing="fresh",
)
defjvp(reduce_min_p, _extremum_jvp)
defvjp(reduce_min_p, _extremum_vjp)


@tensor_method(reduce_min_p)
def min(x: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """The smallest values over `axis` (None: every axis), as torch.amin: ties share the
    gradient equally. `x.min(axis)` gives the values only, as `x.max(axis)` does (PyTorch's
    `x.min(dim)` also gives indices: `argmin` has them)."""
    axes = _refuse_empty("min", x, normalize_axes("min", x, axis))
    return reduce_min_p.bind(x, axes=axes, keepdims=keepdims)


# ---------------------------------------------------------------- prod


def _prod_shape(x: Any, axes: tuple[int, ...], keepdims: bool) -> tuple[Shape, Any]:
    dtype = dtype_of(x)
    if dtype is not None and not is_float(dtype):  # bools and small ints widen, as NumPy
        dtype = np.prod(np.zeros(1, dtype)).dtype
    return reduced_shape(shape_of(x), axes, keepdims), dtype


reduce_prod_p = declare(
    "prod",
    lambda backend, x, axes, keepdims: backend.reduce_prod(x, axes, keepdims),
    _prod_shape,
    saves_inputs=True,
    aliasing="fresh",
)


def _prod_of_others(x: Any, axes: tuple[int, ...]) -> Any:
    """Each element's derivative of the product over `axes`: the product of the other
    elements of its slice, without dividing by zero. A slice without zeros gives
    prod / x; with one zero, the zero's entry is the product of the rest and the others
    are 0; with two or more, every entry is 0 (as PyTorch's prod backward). Second
    derivatives come out right where no element is zero."""
    shape = shape_of(x)
    zero = equal(x, 0.0)
    zeros = _expand(sum(astype(zero, np.dtype(np.int64)), axes, True), shape, axes, True)
    safe = where(zero, 1.0, x)
    rest = _expand(prod(safe, axes, True), shape, axes, True)  # of the nonzero elements
    at_zero = where(equal(zeros, 1), rest, 0.0)
    return where(zero, at_zero, where(equal(zeros, 0), div(rest, safe), 0.0))


defjvp(reduce_prod_p, lambda t, out, x, axes, keepdims: sum(
    mul(t, _prod_of_others(x, axes)), axes, keepdims))


@tensor_method(reduce_prod_p)
def prod(x: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """The product over `axis` (None: every axis); ints and bools multiply as int64."""
    return reduce_prod_p.bind(x, axes=normalize_axes("prod", x, axis), keepdims=keepdims)


# ---------------------------------------------------------------- argmax and argmin


def _arg_shape(op: str) -> Callable[..., tuple[Shape, np.dtype[Any]]]:
    def rule(x: Any, axis: int | None, keepdims: bool) -> tuple[Shape, np.dtype[Any]]:
        shape = shape_of(x)
        empty = any(d == 0 for d in shape) if axis is None else shape[axis] == 0
        if empty:
            raise KernelError(op, (x,), f"{op} of an empty selection")
        if axis is None:
            out = (1,) * len(shape) if keepdims else ()
        else:
            out = reduced_shape(shape, (axis,), keepdims)
        return out, np.dtype(np.int64)

    return rule


argmax_p = declare("argmax", lambda backend, x, axis, keepdims: backend.argmax(x, axis, keepdims),
                   _arg_shape("argmax"), differentiable=False, aliasing="fresh")
argmin_p = declare("argmin", lambda backend, x, axis, keepdims: backend.argmin(x, axis, keepdims),
                   _arg_shape("argmin"), differentiable=False, aliasing="fresh")


def _one_axis_or_none(op: str, x: Any, axis: int | None, keepdims: bool) -> int | None:
    """`axis` as a non-negative int, or None (every axis); refused where it is empty."""
    if axis is not None:
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise KernelError(op, (x,), f"axis must be an int or None, not {axis!r}")
        axes = normalize_axes(op, x, int(axis))
        axis = axes[0] if axes else None  # a 0-d tensor's axis 0 is all of it
    _arg_shape(op)(x, axis, keepdims)
    return axis


@tensor_method(argmax_p)
def argmax(x: TensorLike, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """int64 index of the first largest value along `axis` (None: in the flattened
    tensor), as torch.argmax; no gradient."""
    return argmax_p.bind(x, axis=_one_axis_or_none("argmax", x, axis, keepdims),
                         keepdims=keepdims)


@tensor_method(argmin_p)
def argmin(x: TensorLike, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """int64 index of the first smallest value along `axis` (None: in the flattened
    tensor), as torch.argmin; no gradient."""
    return argmin_p.bind(x, axis=_one_axis_or_none("argmin", x, axis, keepdims),
                         keepdims=keepdims)


def _row_shape(op: str) -> Callable[..., tuple[Shape, Any]]:
    def rule(x: Any, axis: int) -> tuple[Shape, Any]:
        return shape_of(x), dtype_of(x)

    return rule


softmax_p = declare("softmax", lambda backend, x, axis: backend.softmax(x, axis),
                    _row_shape("softmax"), saves_output=True, aliasing="fresh")
defjvp(softmax_p, lambda t, y, x, axis: mul(y, sub(t, sum(mul(y, t), axis, True))))
defvjp(softmax_p, lambda be, g, n: (be.softmax_backward(g, n.output, n.params["axis"]),))
backward_kernel(softmax_p, "softmax_backward", symmetric=True)

log_softmax_p = declare("log_softmax", lambda backend, x, axis: backend.log_softmax(x, axis),
                        _row_shape("log_softmax"), saves_output=True, aliasing="fresh")
defjvp(log_softmax_p, lambda t, y, x, axis: sub(t, sum(mul(exp(y), t), axis, True)))
defvjp(log_softmax_p, lambda be, g, n: (be.log_softmax_backward(g, n.output, n.params["axis"]),))
backward_kernel(log_softmax_p, "log_softmax_backward")


def _along_one_axis(prim: Primitive, x: TensorLike, axis: int) -> Tensor:
    """`prim` along one axis; a 0-d operand is taken as a one-element row (PyTorch's
    softmax of a 0-d tensor is 1), so its derivatives need no 0-d case of their own."""
    axes = normalize_axes(prim.name, x, axis)
    if not axes:
        return reshape(prim.bind(reshape(x, (1,)), axis=0), ())
    return prim.bind(x, axis=axes[0])


@tensor_method(softmax_p)
def softmax(x: TensorLike, axis: int = -1) -> Tensor:
    """e**x normalized to sum to 1 along `axis`."""
    return _along_one_axis(softmax_p, x, axis)


@tensor_method(log_softmax_p)
def log_softmax(x: TensorLike, axis: int = -1) -> Tensor:
    """log(softmax(x, axis)), computed without overflow."""
    return _along_one_axis(log_softmax_p, x, axis)


# ---------------------------------------------------------------- logsumexp and cumsum


def _logsumexp_shape(x: Any, axes: tuple[int, ...], keepdims: bool) -> tuple[Shape, Any]:
    if not is_float(dtype_of(x)):
        raise KernelError("logsumexp", (x,), "expected a floating dtype")
    return reduced_shape(shape_of(x), axes, keepdims), dtype_of(x)


def _logsumexp_impl(backend: Any, x: Any, axes: tuple[int, ...], keepdims: bool) -> Any:
    """log(sum(e**(x - m))) + m, m the max over the axes: every term is at most 1, so
    nothing overflows, and the largest is exact. Composed from the backend's ops (six
    passes, as NumPy would take) rather than one more op every backend must carry."""
    _logsumexp_shape(x, axes, keepdims)
    shape = reduced_shape(shape_of(x), axes, keepdims)
    if any(shape_of(x)[a] == 0 for a in axes):  # the log of an empty sum, as PyTorch
        return backend.full(shape, -math.inf, dtype_of(x))
    m = backend.reduce_max(x, axes, True)
    # An infinite max is not subtracted (inf - inf is NaN): -inf everywhere gives -inf,
    # and +inf gives +inf, through the exp and the log.
    m = backend.where(backend.equal(backend.abs(m), math.inf), 0.0, m)
    total = backend.reduce_sum(backend.exp(backend.sub(x, m)), axes, True)
    return backend.reshape(backend.add(backend.log(total), m), shape)


logsumexp_p = declare("logsumexp", _logsumexp_impl, _logsumexp_shape, saves_inputs=True,
                      saves_output=True, aliasing="fresh")
# The weights e**(x - out) are the softmax over the axes; they sum the tangent.
defjvp(logsumexp_p, lambda t, out, x, axes, keepdims: sum(
    mul(t, exp(sub(x, _expand(out, shape_of(x), axes, keepdims)))), axes, keepdims))


@tensor_method(logsumexp_p)
def logsumexp(x: TensorLike, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """log(sum(exp(x))) over `axis` (None: every axis), without overflow."""
    return logsumexp_p.bind(x, axes=normalize_axes("logsumexp", x, axis), keepdims=keepdims)


def _cumsum_shape(x: Any, axis: int, reverse: bool) -> tuple[Shape, Any]:
    dtype = dtype_of(x)
    if dtype is not None and not is_float(dtype):  # bools and small ints widen, as NumPy
        dtype = np.cumsum(np.zeros(1, dtype)).dtype
    return shape_of(x), dtype


# `reverse` sums from the end of the axis: the transpose of a running sum.
cumsum_p = declare("cumsum",
                   lambda backend, x, axis, reverse: backend.cumsum(x, axis, reverse),
                   _cumsum_shape, aliasing="fresh")
deflinear(cumsum_p, lambda ct, x, axis, reverse: (
    cumsum_p.bind(ct, axis=axis, reverse=not reverse),))


@tensor_method(cumsum_p)
def cumsum(x: TensorLike, axis: int) -> Tensor:
    """Running sums along `axis`, as torch.cumsum(x, dim)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise KernelError("cumsum", (x,), f"axis must be an int, not {axis!r}")
    axes = normalize_axes("cumsum", x, int(axis))
    if not axes:  # a 0-d tensor is a one-element row (PyTorch gives it back)
        return reshape(cumsum_p.bind(reshape(x, (1,)), axis=0, reverse=False), ())
    return cumsum_p.bind(x, axis=axes[0], reverse=False)


# ---------------------------------------------------------------- samples for `pullback check`

# reductions and row-wise normalizations
declare_check(reduce_sum_p, lambda x: (sum(x, axis=1), sum(x, axis=(0, 2), keepdims=True), sum(x)),
              inputs(normal(2, 3, 4)))
declare_check(reduce_max_p, lambda x: (max(x, axis=2), max(x, axis=(0, 1), keepdims=True)),
              inputs(distinct(2, 3, 4)))
declare_check(reduce_min_p, lambda x: (min(x, axis=2), min(x, axis=(0, 1), keepdims=True)),
              inputs(distinct(2, 3, 4)))
declare_check(reduce_prod_p, lambda x: (prod(x, axis=1), prod(x, axis=0, keepdims=True)),
              inputs(nonzero(2, 3)))
declare_check(argmax_p, lambda x: argmax(x, axis=1), inputs(distinct(3, 4, 2)),
              reference=lambda x: np.argmax(x, axis=1))
declare_check(argmin_p, lambda x: argmin(x), inputs(distinct(3, 4)), reference=np.argmin)
declare_check(softmax_p, lambda x: (softmax(x), softmax(x, axis=0)), inputs(normal(3, 5)))
declare_check(log_softmax_p, lambda x: (log_softmax(x), log_softmax(x, axis=0)),
              inputs(normal(3, 5)))
declare_check(logsumexp_p, lambda x: (logsumexp(x), logsumexp(x, axis=1),
                                      logsumexp(x, axis=(0, 2), keepdims=True)),
              inputs(normal(2, 3, 4)))
declare_check(cumsum_p, lambda x: (cumsum(x, 1), cumsum(x, -1)), inputs(normal(2, 3, 4)))
