"""Adam and AdamW, as torch.optim.Adam and torch.optim.AdamW (amsgrad off).

Adam's weight decay is coupled (added to the gradient); AdamW's is decoupled
(`p -= lr * weight_decay * p`, beside the Adam step). float32 and float64 steps run as
one fused kernel (pullback.kernels.updates), decay included; other dtypes run the same
arithmetic in NumPy."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..kernels import updates
from ..kernels.core import SUPPORTED_DTYPES
from ._checks import real
from .applyer import GradApplyer, _Default
from .groups import Params
from .train_params import TrainParams


class Adam(GradApplyer):
    """`m = lerp(m, g, 1 - beta1)`; `v = beta2 * v + (1 - beta2) * g * g`;
    `p -= lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)`, with `t`
    counted per parameter (a parameter without a gradient in a step keeps its t)."""

    _decoupled: ClassVar[bool] = False
    _buffer_names: ClassVar[tuple[str, ...]] = ("step", "exp_avg", "exp_avg_sq")
    _count_buffers: ClassVar[tuple[str, ...]] = ("step",)
    betas = _Default[tuple[float, float]]()
    eps = _Default[float]()
    weight_decay = _Default[float]()

    def __init__(self, params: Params, lr: float | TrainParams,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        super().__init__(params, lr, betas=betas, eps=eps, weight_decay=weight_decay)

    @staticmethod
    def _check_group(where: str, group: Mapping[str, Any]) -> dict[str, Any]:
        try:
            beta1, beta2 = group["betas"]
        except (TypeError, ValueError):
            raise ValueError(
                f"{where}: betas must be a pair (beta1, beta2), got {group['betas']!r}"
            ) from None
        betas = (real(where, "betas[0]", beta1, low=0.0, high=1.0, high_open=True),
                 real(where, "betas[1]", beta2, low=0.0, high=1.0, high_open=True))
        return {"lr": real(where, "lr", group["lr"], low=0.0), "betas": betas,
                "eps": real(where, "eps", group["eps"], low=0.0),
                "weight_decay": real(where, "weight_decay", group["weight_decay"], low=0.0)}

    def _rule(self, index: int, param: np.ndarray, grad: np.ndarray, lr: float, scale: float,
              tmp: np.ndarray, out: np.ndarray, group: dict[str, Any]) -> None:
        # Both decays happen here, fused into the step.
        state = self._state_of(index, param, self._buffer_names)
        step_array, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
        step_array += 1
        step = int(step_array)
        beta1, beta2 = group["betas"]
        eps, weight_decay = group["eps"], group["weight_decay"]
        weight = 1.0 - beta1
        step_size = lr / (1.0 - beta1**step)
        correction2_sqrt = math.sqrt(1.0 - beta2**step)
        coupled = 0.0 if self._decoupled else weight_decay
        decoupled = lr * weight_decay if self._decoupled else 0.0
        if param.dtype in SUPPORTED_DTYPES:
            self._fused(index, updates.adam_update,
                        (param, grad, exp_avg, exp_avg_sq, coupled, weight, 1.0 - weight,
                         weight < 0.5, beta2, 1.0 - beta2, step_size * scale, correction2_sqrt,
                         eps, decoupled * scale), (param, exp_avg, exp_avg_sq))
            return
        if coupled:
            grad = np.add(grad, np.multiply(param, coupled, out=out), out=out)
        # exp_avg.lerp_(grad, 1 - beta1), with PyTorch's two formulas for small and large weights.
        np.subtract(grad, exp_avg, out=tmp)
        if weight < 0.5:
            np.add(exp_avg, np.multiply(tmp, weight, out=tmp), out=exp_avg)
        else:
            np.subtract(grad, np.multiply(tmp, 1.0 - weight, out=tmp), out=exp_avg)
        np.multiply(exp_avg_sq, beta2, out=exp_avg_sq)
        np.multiply(grad, 1.0 - beta2, out=tmp)
        np.add(exp_avg_sq, np.multiply(tmp, grad, out=tmp), out=exp_avg_sq)

        denom = np.sqrt(exp_avg_sq, out=tmp)
        np.add(np.divide(denom, correction2_sqrt, out=denom), eps, out=denom)
        update = np.divide(np.multiply(exp_avg, step_size, out=out), denom, out=out)
        if decoupled:
            # Part of the update, so a parameter's lr scale scales the decay as well.
            np.add(update, np.multiply(param, decoupled, out=tmp), out=update)
        self._subtract(param, update, scale)


class AdamW(Adam):
    """Adam with decoupled weight decay: `p -= lr * weight_decay * p` beside the Adam step."""

    _decoupled: ClassVar[bool] = True

    def __init__(self, params: Params, lr: float | TrainParams,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01) -> None:
        super().__init__(params, lr, betas=betas, eps=eps, weight_decay=weight_decay)
