"""Losses, as torch.nn.functional spells them: cross_entropy, nll_loss,
binary_cross_entropy_with_logits, mse_loss, l1_loss, smooth_l1_loss, huber_loss.

Cross-entropy on class indices is one fused primitive (ops.cross_entropy: one pass
per row forward and backward, the hot loss of classifier training); the others are
composed of primitives in numerically stable forms (log-softmax, softplus), so their
gradients and higher derivatives come from the primitives' rules. Every loss takes
`reduction` "mean", "sum" or "none" and checks its operands up front, naming itself.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .. import ops
from ..errors import KernelError
from ..ops.hints import Shape, TensorLike
from ..tensor import Tensor

REDUCTIONS = ("mean", "sum", "none")


def _reduction(loss: str, reduction: object) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{loss}: reduction must be 'mean', 'sum' or 'none', not "
                         f"{reduction!r}")


def _array(x: object) -> NDArray[Any]:
    """What the checks read of an operand: its array (a tensor's own, not copied)."""
    data = getattr(x, "_data", x)
    return data if isinstance(data, np.ndarray) else np.asarray(data)


def _float_input(loss: str, x: TensorLike, other: TensorLike) -> np.dtype[Any]:
    dtype = _array(x).dtype
    if dtype.kind != "f":
        raise KernelError(loss, (x, other), "the input must be floating")
    return dtype


def _mean(values: Tensor, count: int | Tensor) -> Tensor:
    """sum(values) / count; an empty mean is NaN (0 / 0), as PyTorch gives it, not an error."""
    if isinstance(count, int):
        return ops.mul(ops.sum(values), 1.0 / count if count else math.nan)
    return ops.div(ops.sum(values), count)


def _reduce(values: Tensor, reduction: str, count: int | Tensor | None = None) -> Tensor:
    if reduction == "none":
        return values
    if reduction == "sum":
        return ops.sum(values)
    return _mean(values, int(np.prod(values.shape, dtype=np.int64)) if count is None else count)


# ---------------------------------------------------------------- classification


def _class_layout(loss: str, x: Tensor, target: TensorLike) -> tuple[int, Shape]:
    """The class count and the label shape that input (N, C, d1, ...) or (C,) needs."""
    shape = tuple(x.shape)
    if not shape:
        raise KernelError(loss, (x, target), "the input must be (N, C, ...) or (C,)")
    return (shape[1], shape[:1] + shape[2:]) if len(shape) > 1 else (shape[0], ())


def _check_labels(loss: str, x: Tensor, target: TensorLike, ignore_index: int) -> int:
    """The class count, once the labels are checked: integers of the shape x needs, each
    in [0, C) or ignore_index; else a KernelError."""
    classes, label_shape = _class_layout(loss, x, target)
    labels = _array(target)
    if labels.dtype.kind not in "iu":
        raise KernelError(loss, (x, target), "labels must be integers")
    if labels.shape != label_shape:
        raise KernelError(loss, (x, target), f"the input needs labels of shape {label_shape}")
    if not labels.size or (labels.min() >= 0 and labels.max() < classes):
        return classes
    counted = labels[labels != ignore_index]
    if counted.size and (counted.min() < 0 or counted.max() >= classes):
        raise KernelError(loss, (x, target), f"labels must lie in [0, {classes}) or be "
                          f"ignore_index ({ignore_index}), got values from {counted.min()} to "
                          f"{counted.max()}")
    return classes


def _classes_last(x: Tensor) -> Tensor:
    """(N, C, d1, ...) as (N, d1, ..., C) (a view), (N, C) and (C,) as they are."""
    ndim = len(x.shape)
    return x if ndim <= 2 else ops.transpose(x, (0, *range(2, ndim), 1))


def _counted(target: TensorLike, ignore_index: int) -> Tensor:
    """A bool tensor: which labels count (are not ignore_index)."""
    return ops.not_equal(target, ignore_index)


def cross_entropy(logits: Tensor, target: TensorLike, ignore_index: int = -100,
                  label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """torch.nn.functional.cross_entropy: logits (N, C, d1, ...) or (C,), and either
    integer class labels (N, d1, ...) (those equal to `ignore_index` left out, the mean
    taken over the others) or class probabilities of the logits' shape.
    `label_smoothing` mixes the target with the uniform distribution over classes."""
    _reduction("cross_entropy", reduction)
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be a number in [0, 1], not "
                         f"{label_smoothing!r}")
    if not isinstance(target, (Tensor, np.ndarray)):
        target = np.asarray(target)
    dtype = _float_input("cross_entropy", logits, target)
    if _array(target).dtype.kind == "f":
        return _cross_entropy_probabilities(logits, target, dtype, label_smoothing, reduction)
    classes = _check_labels("cross_entropy", logits, target, ignore_index)
    unbatched = len(logits.shape) == 1
    rows = ops.reshape(logits, (1, classes)) if unbatched else _classes_last(logits)
    labels = ops.reshape(target, (1,)) if unbatched else target
    # The labels stay an operand of the primitive: a lowered plan replays it on new labels.
    loss = ops.cross_entropy(rows, labels, ignore_index, reduction)
    if label_smoothing:
        # PyTorch's: (1 - eps) * nll + eps * (the mean over classes of -log p), on the
        # rows that count.
        counted = _counted(labels, ignore_index)
        uniform = ops.where(counted, ops.neg(ops.mean(ops.log_softmax(rows, -1), -1)), 0.0)
        count = ops.sum(ops.astype(counted, dtype))
        loss = ops.add(ops.mul(loss, 1.0 - label_smoothing),
                       ops.mul(_reduce(uniform, reduction, count), float(label_smoothing)))
    return ops.reshape(loss, ()) if unbatched and reduction == "none" else loss


def _cross_entropy_probabilities(logits: Tensor, target: Tensor | NDArray[Any],
                                 dtype: np.dtype[Any],
                                 label_smoothing: float, reduction: str) -> Tensor:
    shape = tuple(logits.shape)
    if tuple(target.shape) != shape:
        _, label_shape = _class_layout("cross_entropy", logits, target)
        reason = "labels must be integers" if tuple(target.shape) == label_shape else \
            f"class probabilities must have the logits' shape {shape}"
        raise KernelError("cross_entropy", (logits, target), reason)
    if _array(target).dtype != dtype:
        raise KernelError("cross_entropy", (logits, target), "class probabilities must have "
                          "the logits' dtype")
    axis = 1 if len(shape) > 1 else 0
    if label_smoothing:
        target = ops.add(ops.mul(target, 1.0 - label_smoothing),
                         float(label_smoothing) / shape[axis])
    per_row = ops.neg(ops.sum(ops.mul(ops.log_softmax(logits, axis), target), axis))
    return _reduce(per_row, reduction)


def nll_loss(input: Tensor, target: TensorLike, ignore_index: int = -100,
             reduction: str = "mean") -> Tensor:
    """torch.nn.functional.nll_loss: -input[n, label, d1, ...] for log-probabilities
    (N, C, d1, ...) or (C,) and integer labels (N, d1, ...), those equal to
    `ignore_index` left out (the mean is over the others)."""
    _reduction("nll_loss", reduction)
    if not isinstance(target, (Tensor, np.ndarray)):
        target = np.asarray(target)
    dtype = _float_input("nll_loss", input, target)
    _check_labels("nll_loss", input, target, ignore_index)
    shape = tuple(input.shape)
    counted = _counted(target, ignore_index)
    safe = ops.where(counted, target, 0)  # an ignored label picks class 0, then drops it
    axis = 1 if len(shape) > 1 else 0
    index_shape = shape[:1] + (1,) + shape[2:] if axis else (1,)
    picked = ops.take_along_axis(input, ops.reshape(safe, index_shape), axis)
    per_row = ops.where(counted, ops.neg(ops.reshape(picked, tuple(safe.shape))), 0.0)
    return _reduce(per_row, reduction, ops.sum(ops.astype(counted, dtype)))


def binary_cross_entropy_with_logits(input: TensorLike, target: TensorLike,
                                     weight: TensorLike | None = None, reduction: str = "mean",
                                     pos_weight: TensorLike | None = None) -> Tensor:
    """torch.nn.functional.binary_cross_entropy_with_logits: -[p y log sigmoid(x) +
    (1 - y) log(1 - sigmoid(x))] per element, p the `pos_weight` (broadcast along the
    last axis, one per class) and `weight` rescaling each element; softplus keeps it
    finite for any logit."""
    _reduction("binary_cross_entropy_with_logits", reduction)
    _same_floats("binary_cross_entropy_with_logits", input, target)
    for name, extra in (("weight", weight), ("pos_weight", pos_weight)):
        if extra is not None:
            _broadcasts("binary_cross_entropy_with_logits", input, extra, name)
    if pos_weight is None:
        # (1 - y) x + softplus(-x) = softplus(x) - x y
        loss = ops.sub(ops.softplus(input), ops.mul(input, target))
    else:
        # (1 - y) x + (1 + (p - 1) y) softplus(-x)
        scale = ops.add(ops.mul(ops.sub(pos_weight, 1.0), target), 1.0)
        loss = ops.add(ops.mul(ops.sub(1.0, target), input),
                       ops.mul(scale, ops.softplus(ops.neg(input))))
    if weight is not None:
        loss = ops.mul(loss, weight)
    return _reduce(loss, reduction)


# ---------------------------------------------------------------- regression


def _same_floats(loss: str, input: TensorLike, target: TensorLike) -> None:
    """input and target: floating, of one shape and one dtype; else a KernelError."""
    if tuple(np.shape(input)) != tuple(np.shape(target)):
        raise KernelError(loss, (input, target), "input and target must have the same shape")
    dtypes = {_array(input).dtype, _array(target).dtype}
    if any(d.kind != "f" for d in dtypes) or len(dtypes) > 1:
        raise KernelError(loss, (input, target), "input and target must be floating, of one "
                          "dtype")


def _broadcasts(loss: str, input: TensorLike, extra: TensorLike, name: str) -> None:
    try:
        shape = np.broadcast_shapes(tuple(np.shape(input)), tuple(np.shape(extra)))
    except ValueError:
        shape = None
    if shape != tuple(np.shape(input)) or _array(extra).dtype != _array(input).dtype:
        raise KernelError(loss, (input, extra), f"{name} must broadcast to the input's shape "
                          "and have its dtype")


def mse_loss(pred: TensorLike, target: TensorLike, reduction: str = "mean") -> Tensor:
    """torch.nn.functional.mse_loss: (pred - target) ** 2, shapes and dtypes equal."""
    _reduction("mse_loss", reduction)
    _same_floats("mse_loss", pred, target)
    diff = ops.sub(pred, target)
    return _reduce(ops.mul(diff, diff), reduction)


def l1_loss(input: TensorLike, target: TensorLike, reduction: str = "mean") -> Tensor:
    """torch.nn.functional.l1_loss: |input - target|."""
    _reduction("l1_loss", reduction)
    _same_floats("l1_loss", input, target)
    return _reduce(ops.abs(ops.sub(input, target)), reduction)


def _piecewise(input: TensorLike, target: TensorLike, bound: float, slope: float) -> Tensor:
    """0.5 d**2 / (bound / slope) where |d| < bound, else slope (|d| - 0.5 bound)."""
    diff = ops.sub(input, target)
    size = ops.abs(diff)
    quadratic = ops.mul(ops.mul(diff, diff), 0.5 * slope / bound)
    linear = ops.mul(ops.sub(size, 0.5 * bound), slope)
    return ops.where(ops.less(size, bound), quadratic, linear)


def smooth_l1_loss(input: TensorLike, target: TensorLike, reduction: str = "mean",
                   beta: float = 1.0) -> Tensor:
    """torch.nn.functional.smooth_l1_loss: 0.5 d**2 / beta where |d| < beta, else
    |d| - 0.5 beta (l1_loss when beta is 0)."""
    _reduction("smooth_l1_loss", reduction)
    _same_floats("smooth_l1_loss", input, target)
    if not beta >= 0:
        raise ValueError(f"smooth_l1_loss: beta must be non-negative, not {beta!r}")
    if beta == 0:
        return l1_loss(input, target, reduction)
    return _reduce(_piecewise(input, target, float(beta), 1.0), reduction)


def huber_loss(input: TensorLike, target: TensorLike, reduction: str = "mean",
               delta: float = 1.0) -> Tensor:
    """torch.nn.functional.huber_loss: 0.5 d**2 where |d| < delta, else
    delta (|d| - 0.5 delta)."""
    _reduction("huber_loss", reduction)
    _same_floats("huber_loss", input, target)
    if not delta > 0:
        raise ValueError(f"huber_loss: delta must be positive, not {delta!r}")
    return _reduce(_piecewise(input, target, float(delta), float(delta)), reduction)
