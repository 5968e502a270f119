"""Losses: cross_entropy (integer labels, mean) and mse_loss (mean)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ops
from ..errors import KernelError
from ..tensor import Tensor


def cross_entropy(logits: Any, labels: Any) -> Tensor:
    """Mean over the batch of -log softmax(logits)[label]; numerically stable.

    `logits` has shape (N, C); `labels` holds N integers in [0, C).
    """
    labels = np.asarray(labels._data if isinstance(labels, Tensor) else labels)
    shape = tuple(logits.shape)
    # KernelError names the op, both shapes and both dtypes: "cross_entropy: (2, 4) and (2,):
    # labels must be integers (dtypes float32 and float64)".
    if len(shape) != 2:
        raise KernelError("cross_entropy", (logits, labels), "logits must have shape (N, C)")
    if labels.dtype.kind not in "iu":
        raise KernelError("cross_entropy", (logits, labels), "labels must be integers")
    if labels.shape != (shape[0],):
        raise KernelError("cross_entropy", (logits, labels),
                          f"the logits need labels of shape ({shape[0]},)")
    if labels.size and (labels.min() < 0 or labels.max() >= shape[1]):
        raise KernelError("cross_entropy", (logits, labels), f"labels must lie in "
                          f"[0, {shape[1]}), got values from {labels.min()} to {labels.max()}")
    # The labels stay an operand of the primitive: a lowered plan replays it on new labels.
    return ops.cross_entropy(logits, labels)


def mse_loss(pred: Any, target: Any) -> Tensor:
    """Mean of the squared differences; shapes must match."""
    if tuple(pred.shape) != tuple(np.shape(target)):
        raise ValueError(f"mse_loss: pred {tuple(pred.shape)} and target "
                         f"{tuple(np.shape(target))} must have the same shape")
    diff = ops.sub(pred, target)
    return ops.mean(ops.mul(diff, diff))
