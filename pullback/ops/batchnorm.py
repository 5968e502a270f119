"""batch_norm: normalize each channel (axis 1) of (N, C, *spatial), then scale and
shift, as one primitive, with torch.nn.functional.batch_norm's meaning.

In training mode it normalizes with the batch's mean and biased variance; forward and
backward run as the backend's fused ops (`FusedOps.batch_norm` and
`batch_norm_backward`: one Numba pass per channel on the CPU backends). In eval mode it
normalizes with the running statistics, an affine map per channel; its backward is
its rule transposed. The JVP rules are written in primitives, so forward mode and
higher orders work in both modes. Updating the running statistics in training mode is
a side effect of `batch_norm`, done in place outside differentiation; the primitive
never sees them then, so a pending backward never holds the arrays it overwrites. A
compiled plan records the update as state and repeats it at every call. The update
reads the batch's mean and variance from `batch_norm_statistics`, a primitive of its
own (one fused pass per channel on the CPU backends, as the forward's own first two),
not from NumPy reductions over the whole batch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..ad import defjvp, defvjp
from ..backend.backward_ops import BackwardOps
from ..backend.base import Backend
from ..backend.fused import fused_ops
from ..errors import KernelError
from .backward_defaults import rule_vjp
from .checks import declare_check, inputs, normal, positive
from .elementwise import add, div, mul, sqrt, sub
from .hints import TensorLike
from .reduce import mean
from .registry import declare, dtype_of, is_float, shape_of, writes_cotangent_into
from .shape import broadcast_to, getitem, reshape, stack, stop_gradient_p

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["batch_norm"]

_NAMES = ("running_mean", "running_var", "weight", "bias")


def _shape(x: Any, running_mean: Any, running_var: Any, weight: Any, bias: Any,
           training: bool, eps: float) -> tuple[Any, ...]:
    shape = shape_of(x)
    given = (running_mean, running_var, weight, bias)
    operands = tuple(v for v in (x, *given) if v is not None)  # what the error lists
    if len(shape) < 2 or not is_float(dtype_of(x)):
        raise KernelError("batch_norm", operands, "x must be floating, of shape (N, C) or "
                          "(N, C, *spatial)")
    for name, v in zip(_NAMES, given):
        if v is not None and (shape_of(v) != shape[1:2] or dtype_of(v) != dtype_of(x)):
            raise KernelError("batch_norm", operands, f"{name} must have shape ({shape[1]},) "
                              "(one value per channel, axis 1) and x's dtype")
    if training and shape[1] and math.prod(shape) // shape[1] == 1:
        raise KernelError("batch_norm", operands, "training mode needs more than one value "
                          "per channel to compute a variance")
    if not training and (running_mean is None or running_var is None):
        raise KernelError("batch_norm", operands, "eval mode (training=False) normalizes with "
                          "running_mean and running_var: pass both, or training=True")
    return shape, dtype_of(x)


def _eval_affine(backend: Backend, x: Any, running_mean: Any, running_var: Any, weight: Any,
                 bias: Any, eps: float) -> Any:
    """x * scale + shift per channel, the running statistics folded into (C,) vectors."""
    scale = backend.div(1.0, backend.sqrt(backend.add(running_var, eps)))
    if weight is not None:
        scale = backend.mul(scale, weight)
    shift = backend.mul(backend.mul(running_mean, scale), -1.0)
    if bias is not None:
        shift = backend.add(shift, bias)
    column = _column_shape(x.ndim, x.shape[1])
    return backend.add(backend.mul(x, backend.reshape(scale, column)),
                       backend.reshape(shift, column))


def _impl(backend: Backend, x: Any, running_mean: Any, running_var: Any, weight: Any, bias: Any,
          training: bool, eps: float) -> Any:
    # Eager calls skip shape rules; these shapes must agree.
    _shape(x, running_mean, running_var, weight, bias, training, eps)
    if training:
        return fused_ops(backend).batch_norm(x, weight, bias, eps)[0]
    return _eval_affine(backend, x, running_mean, running_var, weight, bias, eps)


batch_norm_p = declare("batch_norm", _impl, _shape, saves_inputs=True, aliasing="fresh")


def _then_relu(backend: Any, x: Any, running_mean: Any, running_var: Any, weight: Any,
               bias: Any, training: bool, eps: float, out: Any = None) -> Any:
    """relu(batch_norm(...)): in training mode the backend's kernel writes relu's result
    (`FusedOps.batch_norm(relu=True)`), one pass over memory less than the two ops, into
    `out` (a plan's buffer) on a backend that runs plan kernels (CpuBackend's
    batch_norm takes `out=`, as its conv2d_epilogue does); eval mode's affine map, then
    relu."""
    if not training:
        return backend.relu(_impl(backend, x, running_mean, running_var, weight, bias,
                                  training, eps))
    if out is not None and backend.runs_plan_kernels():
        return backend.batch_norm(x, weight, bias, eps, relu=True, out=out)[0]
    return fused_ops(backend).batch_norm(x, weight, bias, eps, relu=True)[0]


batch_norm_p.then_relu = _then_relu


# ---------------------------------------------------------------- derivative rules


def _column_shape(ndim: int, channels: int) -> tuple[int, ...]:
    return (1, channels) + (1,) * (ndim - 2)


def _column(v: Any, ndim: int) -> Tensor:
    """A (C,) vector shaped to broadcast over (N, C, *spatial)."""
    return reshape(v, _column_shape(ndim, shape_of(v)[0]))


def _axes(ndim: int) -> tuple[int, ...]:
    return (0, *range(2, ndim))


def _batch_normalized(x: Any, eps: float) -> tuple[Tensor, Tensor]:
    """(x - mean) * rstd and rstd (shaped (1, C, 1, ...)) with the batch's statistics."""
    axes = _axes(len(shape_of(x)))
    centered = sub(x, mean(x, axes, True))
    rstd = div(1.0, sqrt(add(mean(mul(centered, centered), axes, True), eps)))
    return mul(centered, rstd), rstd


def _running_scale(running_var: Any, weight: Any, eps: float) -> Tensor:
    """weight / sqrt(running_var + eps), (C,): eval mode's slope per channel."""
    scale = div(1.0, sqrt(add(running_var, eps)))
    return scale if weight is None else mul(scale, weight)


def _jvp_x(t: Any, out: Any, x: Any, running_mean: Any, running_var: Any, weight: Any,
           bias: Any, training: bool, eps: float) -> Any:
    ndim = len(shape_of(x))
    if not training:
        return mul(t, _column(_running_scale(running_var, weight, eps), ndim))
    # d xhat = rstd * (t - mean(t) - xhat * mean(t * xhat)), means over the batch axes.
    axes = _axes(ndim)
    xhat, rstd = _batch_normalized(x, eps)
    d = sub(sub(t, mean(t, axes, True)), mul(xhat, mean(mul(t, xhat), axes, True)))
    d = mul(d, rstd)
    return d if weight is None else mul(d, _column(weight, ndim))


def _jvp_running_mean(t: Any, out: Any, x: Any, running_mean: Any, running_var: Any,
                      weight: Any, bias: Any, training: bool, eps: float) -> Any:
    # Only eval mode reads the running statistics (training mode binds None for them).
    slope = mul(mul(t, _running_scale(running_var, weight, eps)), -1.0)
    return broadcast_to(_column(slope, len(shape_of(x))), shape_of(x))


def _jvp_running_var(t: Any, out: Any, x: Any, running_mean: Any, running_var: Any,
                     weight: Any, bias: Any, training: bool, eps: float) -> Any:
    # d/dvar of (x - mean) * (var + eps)**-1/2 * weight = -(x - mean) * weight * rstd**3 / 2.
    ndim = len(shape_of(x))
    rstd = div(1.0, sqrt(add(running_var, eps)))
    slope = mul(mul(mul(rstd, mul(rstd, rstd)), t), -0.5)
    slope = slope if weight is None else mul(slope, weight)
    return mul(sub(x, _column(running_mean, ndim)), _column(slope, ndim))


def _jvp_weight(t: Any, out: Any, x: Any, running_mean: Any, running_var: Any, weight: Any,
                bias: Any, training: bool, eps: float) -> Any:
    ndim = len(shape_of(x))
    if training:
        return mul(_batch_normalized(x, eps)[0], _column(t, ndim))
    rstd = div(1.0, sqrt(add(running_var, eps)))
    return mul(sub(x, _column(running_mean, ndim)), _column(mul(t, rstd), ndim))


def _jvp_bias(t: Any, out: Any, x: Any, running_mean: Any, running_var: Any, weight: Any,
              bias: Any, training: bool, eps: float) -> Any:
    return broadcast_to(_column(t, len(shape_of(x))), shape_of(x))


defjvp(batch_norm_p, _jvp_x, _jvp_running_mean, _jvp_running_var, _jvp_weight, _jvp_bias)


def _vjp(be: BackwardOps, g: Any, n: Any) -> tuple[Any, ...]:
    needed = tuple(p is not None for p in n.parents)
    if not n.params["training"]:
        # Eval mode, an affine map per channel and seldom differentiated (a frozen
        # BatchNorm): its backward is its rule, transposed, on this backend.
        return rule_vjp(batch_norm_p, be, g, n.inputs, None, n.params, n.in_shapes, needed)
    x, _, _, weight, _ = n.inputs
    grad_x, grad_weight, grad_bias = fused_ops(be).batch_norm_backward(g, x, weight,
                                                                       n.params["eps"])
    return (grad_x if needed[0] else None, None, None, grad_weight if needed[3] else None,
            grad_bias if needed[4] else None)


defvjp(batch_norm_p, _vjp)


def _ct_into(be: Any, g: Any, n: Any, out: Any) -> tuple[Any, ...]:
    """_vjp with x's gradient written into `out` (a plan's cotangent buffer; `be` runs
    plan kernels, whose batch_norm_backward takes `out=`): training mode's kernel
    writes it there, eval mode's rule is copied in."""
    if not n.params["training"]:
        grads = _vjp(be, g, n)
        out[...] = grads[0]
        return (out, *grads[1:])
    x, _, _, weight, _ = n.inputs
    _, grad_weight, grad_bias = be.batch_norm_backward(g, x, weight, n.params["eps"], out=out)
    return (out, None, None, grad_weight if n.parents[3] is not None else None,
            grad_bias if n.parents[4] is not None else None)


# x's cotangent buffer is laid out as x, (N, C, *spatial) C-ordered, as the kernels write.
writes_cotangent_into(
    batch_norm_p, lambda args, first, by_columns, first_by_columns: "C"
    if len(first.shape) > 2 and not first_by_columns else None, _ct_into)


# ---------------------------------------------------------------- the batch's statistics


def _statistics_shape(x: Any) -> tuple[Any, ...]:
    shape = shape_of(x)
    if len(shape) < 2 or not is_float(dtype_of(x)):
        raise KernelError("batch_norm_statistics", (x,), "x must be floating, of shape (N, C) "
                          "or (N, C, *spatial)")
    return (2, shape[1]), dtype_of(x)


def _statistics_impl(backend: Backend, x: Any) -> Any:
    _statistics_shape(x)
    channels = (1, x.shape[1])
    batch_mean, batch_var = fused_ops(backend).batch_norm_statistics(x)
    return backend.concatenate([backend.reshape(batch_mean, channels),
                                backend.reshape(batch_var, channels)], 0)


#: (2, C): each channel's mean over every axis but 1, and its biased variance.
batch_norm_statistics_p = declare("batch_norm_statistics", _statistics_impl,
                                  _statistics_shape, saves_inputs=True, saves_output=True,
                                  aliasing="fresh")


def _statistics_jvp(t: Any, out: Any, x: Any) -> Any:
    # d mean = mean(t); d var = 2 mean((x - mean) t), the deviations summing to zero.
    ndim = len(shape_of(x))
    axes = _axes(ndim)
    centered = sub(x, _column(getitem(out, 0), ndim))
    return stack([mean(t, axes), mul(mean(mul(centered, t), axes), 2.0)], 0)


defjvp(batch_norm_statistics_p, _statistics_jvp)


# ---------------------------------------------------------------- the public function


def _update_running(x: Any, running_mean: Any, running_var: Any, momentum: Any) -> None:
    """running = (1 - momentum) * running + momentum * batch statistic, in place; the
    variance's statistic is the unbiased one, as PyTorch's."""
    # The update is no part of what is differentiated.
    statistics = batch_norm_statistics_p.bind(stop_gradient_p.bind(x))
    shape = shape_of(x)
    count = math.prod(shape) // shape[1]
    updates = []
    if running_mean is not None:
        updates.append((running_mean, getitem(statistics, 0)))
    if running_var is not None:
        updates.append((running_var, mul(getitem(statistics, 1), count / (count - 1))))
    for running, batch in updates:
        new = add(mul(running, 1.0 - momentum), mul(batch, momentum))
        # Eagerly a write into the array; while tracing, state the plan writes back.
        running.copy_(new)


def batch_norm(x: TensorLike, running_mean: TensorLike | None, running_var: TensorLike | None,
               weight: TensorLike | None = None, bias: TensorLike | None = None,
               training: bool = False, momentum: float | Tensor = 0.1,
               eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.batch_norm: per channel (axis 1) of (N, C) or (N, C,
    *spatial), (x - mean) / sqrt(var + eps) * weight + bias. Training mode uses the
    batch's statistics and updates `running_mean`/`running_var` (tensors, or None) in
    place with `momentum` (a number, or a 0-d tensor); eval mode uses the running
    statistics."""
    eps = float(eps)
    if not bool(training):
        return batch_norm_p.bind(x, running_mean, running_var, weight, bias, training=False,
                                 eps=eps)
    _shape(x, running_mean, running_var, weight, bias, True, eps)
    for running in (running_mean, running_var):
        if running is not None and not hasattr(running, "copy_"):
            raise KernelError("batch_norm", (x, running), "training mode updates running_mean "
                              "and running_var in place: they must be tensors (or None)")
    y = batch_norm_p.bind(x, None, None, weight, bias, training=True, eps=eps)
    # An empty batch leaves the running statistics as they are (as PyTorch's).
    if (running_mean is not None or running_var is not None) and math.prod(shape_of(x)) != 0:
        # A 0-d tensor momentum (a counter's 1 / batches) stays one: traced, not baked.
        factor = momentum if hasattr(momentum, "shape") else float(momentum)
        _update_running(x, running_mean, running_var, factor)
    return y


# ---------------------------------------------------------------- samples for `pullback check`


def _both_modes(x: Any, mean_: Any, var: Any, w: Any, b: Any) -> tuple[Any, ...]:
    return batch_norm(x, None, None, w, b, training=True), batch_norm(x, mean_, var, w, b)


# Few elements and settings: the check differentiates along each element in turn.
declare_check(batch_norm_p, _both_modes,
              inputs(normal(2, 2), normal(2), positive(2), normal(2), normal(2)))
declare_check(batch_norm_statistics_p, batch_norm_statistics_p.bind, inputs(normal(3, 2, 2)))
