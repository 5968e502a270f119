"""RMSProp, with or without momentum, as torch.optim.RMSprop (centered=False);
`beta` is PyTorch's `alpha`. float32 and float64 steps run as one fused kernel
(pullback.kernels.updates); other dtypes run the same arithmetic in NumPy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..kernels import updates
from ..kernels.core import SUPPORTED_DTYPES
from ._checks import real
from .applyer import GradApplyer, _Default
from .groups import Params
from .train_params import TrainParams


class RMSProp(GradApplyer):
    """`v = beta * v + (1 - beta) * g * g`; `p -= lr * g / (sqrt(v) + eps)`, or with
    momentum `buf = momentum * buf + g / (sqrt(v) + eps)` and `p -= lr * buf`. Each may
    differ per parameter group."""

    _buffer_names: ClassVar[tuple[str, ...]] = ("square_avg", "momentum")
    beta = _Default[float]()
    momentum = _Default[float]()
    eps = _Default[float]()

    def __init__(self, params: Params, lr: float | TrainParams, beta: float = 0.9,
                 momentum: float = 0.0, eps: float = 1e-8) -> None:
        super().__init__(params, lr, beta=beta, momentum=momentum, eps=eps)

    @staticmethod
    def _check_group(where: str, group: Mapping[str, Any]) -> dict[str, Any]:
        return {"lr": real(where, "lr", group["lr"], low=0.0),
                "beta": real(where, "beta", group["beta"], low=0.0, high=1.0, high_open=True),
                "momentum": real(where, "momentum", group["momentum"], low=0.0),
                "eps": real(where, "eps", group["eps"], low=0.0)}

    def _buffers_for(self, group: Mapping[str, Any]) -> tuple[str, ...]:
        return ("square_avg", "momentum") if group["momentum"] else ("square_avg",)

    def _rule(self, index: int, param: np.ndarray, grad: np.ndarray, lr: float, scale: float,
              tmp: np.ndarray, out: np.ndarray, group: dict[str, Any]) -> None:
        beta, momentum, eps = group["beta"], group["momentum"], group["eps"]
        state = self._state_of(index, param, self._buffers_for(group))
        square_avg = state["square_avg"]
        if param.dtype in SUPPORTED_DTYPES:
            if momentum:
                buf = state["momentum"]
                self._fused(index, updates.rmsprop_momentum_update,
                            (param, grad, square_avg, buf, lr * scale, beta, 1.0 - beta,
                             eps, momentum), (param, square_avg, buf))
            else:
                self._fused(index, updates.rmsprop_update,
                            (param, grad, square_avg, lr * scale, beta, 1.0 - beta,
                             eps), (param, square_avg))
            return
        np.multiply(square_avg, beta, out=square_avg)
        # ((1 - beta) * g) * g, in PyTorch's addcmul order, so f32 results agree closely.
        np.multiply(grad, 1.0 - beta, out=tmp)
        np.add(square_avg, np.multiply(tmp, grad, out=tmp), out=square_avg)
        avg = np.add(np.sqrt(square_avg, out=tmp), eps, out=tmp)
        if momentum:
            buf = state["momentum"]
            np.multiply(buf, momentum, out=buf)
            np.add(buf, np.divide(grad, avg, out=out), out=buf)
            self._subtract(param, np.multiply(buf, lr, out=out), scale)
            return
        self._subtract(param, np.divide(np.multiply(grad, lr, out=out), avg, out=out), scale)
