"""`clip_grad_norm`: PyTorch's `torch.nn.utils.clip_grad_norm_` over any set of
parameters, scaling their `.grad` in place so that the norm of all of them together
is at most `max_norm` (before an optimizer's `step()`)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from ..tensor import Tensor
from ._checks import real

# As torch.nn.utils.clip_grad_norm_: keeps the coefficient finite for zero gradients.
NORM_EPS = 1e-6


def _norm(grads: list[np.ndarray], norm_type: float) -> float:
    """The `norm_type`-norm of all the gradients' elements together, in float64."""
    if norm_type == math.inf:
        return max(float(np.max(np.abs(g))) if g.size else 0.0 for g in grads)
    if norm_type == 2.0:
        total = sum(float(np.dot(f, f)) for f in (g.reshape(-1).astype(np.float64)
                                                  for g in grads))
        return math.sqrt(total)
    total = sum(float(np.sum(np.abs(g.astype(np.float64)) ** norm_type)) for g in grads)
    return float(total ** (1.0 / norm_type))


def clip_grad_norm(params: Tensor | Iterable[Tensor], max_norm: float,
                   norm_type: float = 2.0, error_if_nonfinite: bool = False) -> Tensor:
    """Scale every `.grad` of `params` by `max_norm / (total + 1e-6)` when their total
    `norm_type`-norm (`math.inf` for the largest magnitude) exceeds `max_norm`, in
    place, as torch.nn.utils.clip_grad_norm_. Parameters without a gradient are
    skipped. Returns the total norm (before clipping) as a 0-d tensor of the
    gradients' dtype (float32 when there are none); a non-finite total raises when
    `error_if_nonfinite`, else the gradients are scaled by the NaN or zero factor,
    as PyTorch's are."""
    where = "clip_grad_norm"
    params = [params] if isinstance(params, Tensor) else list(params)
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"{where}: parameter {i} is a {type(p).__name__}, not a Tensor")
    max_norm = real(where, "max_norm", max_norm, low=0.0)
    if norm_type != math.inf:
        norm_type = real(where, "norm_type", norm_type, low=0.0, low_open=True)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return Tensor(np.zeros((), np.float32))
    dtype = np.result_type(*[g.dtype for g in grads])
    total = _norm([g._data for g in grads], norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"{where}: the total {norm_type}-norm of the gradients is {total}; "
                           "pass error_if_nonfinite=False to scale them anyway")
    coef = min(max_norm / (total + NORM_EPS), 1.0) if not math.isnan(total) else math.nan
    if coef != 1.0:
        for g in grads:
            g._check_writeable(where)
        with np.errstate(invalid="ignore"):  # inf * 0 is NaN, as in PyTorch
            for g in grads:
                np.multiply(g._data, coef, out=g._data)
    return Tensor(np.array(total, dtype=dtype))
