"""Reductions and row-wise normalizations: sum, max, mean, softmax, log_softmax,
logsumexp, and the running sum cumsum."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..ad import defjvp, deflinear, defvjp
from ..errors import KernelError
from .backward_defaults import backward_kernel
from .checks import declare_check, distinct, inputs, normal
from .elementwise import astype, div, equal, exp, mul, sub
from .registry import (
    declare,
    dtype_of,
    is_float,
    normalize_axes,
    reduced_shape,
    shape_of,
    tensor_method,
)
from .shape import broadcast_to, reshape

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["cumsum", "log_softmax", "logsumexp", "max", "mean", "softmax", "sum"]


def _reduce_shape(op: str) -> Any:
    def rule(x: Any, axes: tuple, keepdims: bool) -> tuple:
        return reduced_shape(shape_of(x), axes, keepdims), dtype_of(x)

    return rule


def _expand(ct: Any, shape: tuple, axes: tuple, keepdims: bool) -> Any:
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


def sum(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    axes = normalize_axes("sum", x, axis)
    if not axes and not keepdims and shape_of(x) != ():
        return x
    return reduce_sum_p.bind(x, axes=axes, keepdims=keepdims)


def mean(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    axes = normalize_axes("mean", x, axis)
    count = 1
    for a in axes:
        count *= shape_of(x)[a]
    if count == 0:
        raise KernelError("mean", (x,), "mean of an empty selection")
    return mul(sum(x, axes, keepdims), 1.0 / count)


def _max_shape(x: Any, axes: tuple, keepdims: bool) -> tuple:
    if any(shape_of(x)[a] == 0 for a in axes):
        raise KernelError("max", (x,), "max of an empty selection")
    return reduced_shape(shape_of(x), axes, keepdims), dtype_of(x)


reduce_max_p = declare(
    "max",
    lambda backend, x, axes, keepdims: backend.reduce_max(x, axes, keepdims),
    _max_shape,
    saves_inputs=True,
    saves_output=True,
    aliasing="fresh",
)


def _max_jvp(t: Any, out: Any, x: Any, axes: tuple, keepdims: bool) -> Any:
    # Ties share the derivative equally, as torch.amax does.
    hits = astype(equal(x, _expand(out, shape_of(x), axes, keepdims)), dtype_of(x))
    share = div(hits, _expand(sum(hits, axes, keepdims), shape_of(x), axes, keepdims))
    return sum(mul(t, share), axes, keepdims)


defjvp(reduce_max_p, _max_jvp)
defvjp(reduce_max_p, lambda be, g, n: (be.reduce_max_backward(
    g, n.inputs[0], n.output, n.params["axes"], n.params["keepdims"]),))
backward_kernel(reduce_max_p, "reduce_max_backward")


@tensor_method(reduce_max_p)
def max(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    return reduce_max_p.bind(x, axes=normalize_axes("max", x, axis), keepdims=keepdims)


def _row_shape(op: str) -> Any:
    def rule(x: Any, axis: int) -> tuple:
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


def _along_one_axis(prim: Any, x: Any, axis: int) -> Any:
    """`prim` along one axis; a 0-d operand is taken as a one-element row (PyTorch's
    softmax of a 0-d tensor is 1), so its derivatives need no 0-d case of their own."""
    axes = normalize_axes(prim.name, x, axis)
    if not axes:
        return reshape(prim.bind(reshape(x, (1,)), axis=0), ())
    return prim.bind(x, axis=axes[0])


@tensor_method(softmax_p)
def softmax(x: Any, axis: int = -1) -> Any:
    return _along_one_axis(softmax_p, x, axis)


@tensor_method(log_softmax_p)
def log_softmax(x: Any, axis: int = -1) -> Any:
    return _along_one_axis(log_softmax_p, x, axis)


# ---------------------------------------------------------------- logsumexp and cumsum


def _logsumexp_shape(x: Any, axes: tuple, keepdims: bool) -> tuple:
    if not is_float(dtype_of(x)):
        raise KernelError("logsumexp", (x,), "expected a floating dtype")
    return reduced_shape(shape_of(x), axes, keepdims), dtype_of(x)


def _logsumexp_impl(backend: Any, x: Any, axes: tuple, keepdims: bool) -> Any:
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
def logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """log(sum(exp(x))) over `axis` (None: every axis), without overflow."""
    return logsumexp_p.bind(x, axes=normalize_axes("logsumexp", x, axis), keepdims=keepdims)


def _cumsum_shape(x: Any, axis: int, reverse: bool) -> tuple:
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
def cumsum(x: Any, axis: int) -> Any:
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
declare_check(softmax_p, lambda x: (softmax(x), softmax(x, axis=0)), inputs(normal(3, 5)))
declare_check(log_softmax_p, lambda x: (log_softmax(x), log_softmax(x, axis=0)),
              inputs(normal(3, 5)))
declare_check(logsumexp_p, lambda x: (logsumexp(x), logsumexp(x, axis=1),
                                      logsumexp(x, axis=(0, 2), keepdims=True)),
              inputs(normal(2, 3, 4)))
declare_check(cumsum_p, lambda x: (cumsum(x, 1), cumsum(x, -1)), inputs(normal(2, 3, 4)))
