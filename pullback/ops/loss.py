"""Loss and sampling primitives whose integer or random inputs must stay operands.

`cross_entropy` takes its labels as an operand (not a constant built from
them), and `dropout_mask` draws a fresh mask each time it runs, so that a
lowered plan replays them correctly on new data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ad import defjvp, defvjp
from ..backend.backward_ops import BackwardOps
from ..backend.base import Backend
from ..backend.fused import fused_ops
from ..errors import KernelError
from .checks import declare_check, inputs, labels, normal
from .elementwise import astype, div, exp, mul, not_equal, sub
from .hints import DTypeLike, TensorLike
from .reduce import log_softmax
from .reduce import sum as reduce_sum
from .registry import declare, dtype_of, is_float, shape_of

if TYPE_CHECKING:
    from ..tensor import Tensor

__all__ = ["one_hot"]  # the rest are building blocks the layers above call


def _one_hot_shape(labels: Any, depth: int, dtype: Any) -> tuple[Any, ...]:
    return shape_of(labels) + (depth,), dtype


def _one_hot_impl(backend: Backend, labels: Any, depth: int, dtype: Any) -> Any:
    eye = backend.astype(backend.equal(backend.reshape(labels, tuple(labels.shape) + (1,)),
                                       backend.arange(0, depth, 1, labels.dtype)), dtype)
    return eye


one_hot_p = declare("one_hot", _one_hot_impl, _one_hot_shape, differentiable=False,
                    aliasing="fresh")


def one_hot(labels: TensorLike, num_classes: int = -1, dtype: DTypeLike | None = None
            ) -> Tensor:
    """Rows of zeros with a one at each integer label, as `torch.nn.functional.one_hot`:
    `num_classes=-1` takes the largest label plus one, and the result is int64 unless
    `dtype` says otherwise; no gradient."""
    label_dtype = dtype_of(labels)
    if label_dtype is None or np.dtype(label_dtype).kind not in "iu":
        raise KernelError("one_hot", (labels,), "labels must be an integer tensor")
    if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or \
            num_classes < -1:
        raise KernelError("one_hot", (labels,), f"num_classes must be a non-negative int or "
                          f"-1, not {num_classes!r}")
    # Given num_classes, the labels' values are only checked (the public protocol, which
    # refuses a traced value, only where they set the depth and would be baked).
    values = np.asarray(labels if num_classes == -1 else getattr(labels, "_data", labels))
    if num_classes == -1:
        num_classes = int(values.max()) + 1 if values.size else 0
    if values.size and (values.min() < 0 or values.max() >= num_classes):
        # PyTorch refuses these too; the primitive would give a row of zeros.
        raise KernelError("one_hot", (labels,), f"class values must be in [0, {num_classes}), "
                          f"got {values.min()} to {values.max()}")
    return one_hot_p.bind(labels, depth=int(num_classes),
                          dtype=np.dtype(np.int64) if dtype is None else np.dtype(dtype))


REDUCTIONS = ("mean", "sum", "none")


def _cross_entropy_shape(logits: Any, labels: Any, ignore_index: int, reduction: str
                         ) -> tuple[Any, ...]:
    shape = shape_of(logits)
    if not shape or not is_float(dtype_of(logits)):
        raise KernelError("cross_entropy", (logits, labels), "logits must be (..., C) floating")
    if shape_of(labels) != shape[:-1]:
        raise KernelError("cross_entropy", (logits, labels), f"labels must have shape "
                          f"{shape[:-1]}")
    if reduction not in REDUCTIONS:
        raise KernelError("cross_entropy", (logits, labels), f"reduction must be 'mean', "
                          f"'sum' or 'none', not {reduction!r}")
    return (shape[:-1] if reduction == "none" else ()), dtype_of(logits)


def _on_counted_rows(backend: Backend, logits: Any, labels: Any, ignore_index: int,
                     run: Callable[[Any, Any, int], Any]) -> Any:
    """`run(labels, kept, count)`: on the labels as they are (kept None, count all of
    them) when none is ignore_index, else on the labels with the ignored ones read as
    class 0, `kept` the bool array of those that count and `count` how many do.

    When ignore_index is no class (the default, -100), the fused kernels refuse a label
    equal to it as out of range, so the common batch, without one, pays no extra pass
    over its labels to find out; only a refused batch is looked at again."""
    size = math.prod(labels.shape)
    if not 0 <= ignore_index < logits.shape[-1]:
        try:
            return run(labels, None, size)
        except KernelError:
            pass  # an ignored label, or one out of range, refused again below
    ignored = int(np.count_nonzero(backend.to_numpy(labels) == ignore_index))
    if not ignored:
        return run(labels, None, size)
    kept = backend.not_equal(labels, ignore_index)
    return run(backend.where(kept, labels, 0), kept, size - ignored)


def _cross_entropy_impl(backend: Backend, logits: Any, labels: Any, ignore_index: int,
                        reduction: str) -> Any:
    def run(labels: Any, kept: Any, count: int) -> Any:
        # One pass per row on the CPU backends (FusedOps); labels out of range raise.
        per_row = fused_ops(backend).cross_entropy(logits, labels)
        if kept is not None:
            per_row = backend.where(kept, per_row, 0.0)
        if reduction == "none":
            return per_row
        total = backend.reduce_sum(per_row, tuple(range(labels.ndim)), False)
        return total if reduction == "sum" else backend.mul(total, _mean_scale(count))

    return _on_counted_rows(backend, logits, labels, ignore_index, run)


def _mean_scale(n: int) -> float:
    # The mean of an empty batch is 0 / 0: NaN, as PyTorch gives it (the gradient is empty).
    return 1.0 / n if n else math.nan


cross_entropy_p = declare("cross_entropy", _cross_entropy_impl, _cross_entropy_shape,
                          saves_inputs=True, aliasing="fresh")
cross_entropy_p.exact_inputs = True  # labels stay integers for the fused backward kernel


def _cross_entropy_jvp(t: Any, out: Any, logits: Any, labels: Any, ignore_index: int,
                       reduction: str) -> Any:
    # d loss_row / d logits_row = softmax(logits_row) - one_hot(label) for each row that
    # counts; labels have no derivative.
    dtype = dtype_of(logits)
    kept = astype(not_equal(labels, ignore_index), dtype)
    target = one_hot_p.bind(labels, depth=shape_of(logits)[-1], dtype=dtype)
    per_row = mul(reduce_sum(mul(t, sub(exp(log_softmax(logits, -1)), target)), -1), kept)
    if reduction == "none":
        return per_row
    total = reduce_sum(per_row)
    return total if reduction == "sum" else div(total, reduce_sum(kept))


defjvp(cross_entropy_p, _cross_entropy_jvp, None)


def _cross_entropy_vjp(be: BackwardOps, g: Any, node: Any) -> tuple[Any, ...]:
    logits, labels = node.inputs

    def run(labels: Any, kept: Any, count: int) -> Any:
        upstream = be.mul(g, _mean_scale(count)) if node.params["reduction"] == "mean" else g
        if kept is not None:  # rows that do not count get no gradient
            upstream = be.where(kept, upstream, 0.0)
        return fused_ops(be).cross_entropy_backward(upstream, logits, labels)

    return _on_counted_rows(be, logits, labels, node.params["ignore_index"], run), None


defvjp(cross_entropy_p, _cross_entropy_vjp)


def cross_entropy(logits: TensorLike, labels: TensorLike, ignore_index: int = -100,
                  reduction: str = "mean") -> Tensor:
    """-log softmax(logits)[label] for each row of logits (..., C) and integer labels
    (...): their mean over the labels other than `ignore_index` ("mean"), their sum
    ("sum"), or each ("none"), as one fused primitive."""
    return cross_entropy_p.bind(logits, labels, ignore_index=int(ignore_index),
                                reduction=reduction)


def _mask_shape(x: Any, p: float, rng: Callable[[], np.random.Generator]) -> tuple[Any, ...]:
    return shape_of(x), dtype_of(x)


def _mask_impl(backend: Backend, x: Any, p: float, rng: Callable[[], np.random.Generator]) -> Any:
    keep = backend.asarray(rng().random(x.shape) >= p)
    return backend.mul(backend.astype(keep, x.dtype), 1.0 / (1.0 - p))


dropout_mask_p = declare("dropout_mask", _mask_impl, _mask_shape, differentiable=False,
                         aliasing="fresh")


def dropout_mask(x: TensorLike, p: float, rng: Callable[[], np.random.Generator]) -> Tensor:
    """Zeros with probability p, else 1/(1-p), shaped like x; `rng()` returns the generator
    to draw from at the moment the op runs (so a replayed plan draws afresh)."""
    return dropout_mask_p.bind(x, p=p, rng=rng)


# ---------------------------------------------------------------- samples for `pullback check`

# labels and masks are operands without gradients
declare_check(cross_entropy_p, lambda x, y: (
    cross_entropy(x, y), cross_entropy(x, y, ignore_index=2, reduction="sum"),
    cross_entropy(x, y, ignore_index=1, reduction="none")), inputs(normal(4, 5), labels(3, 4)))
declare_check(one_hot_p, lambda y: one_hot(y, 5, np.float64), inputs(labels(5, 6)),
              reference=lambda y: np.eye(5)[y])
declare_check(dropout_mask_p, lambda x: dropout_mask(x, 0.0, np.random.default_rng),
              inputs(normal(3, 4)), reference=np.ones_like)
