"""SGD with optional momentum, Nesterov momentum and weight decay, as torch.optim.SGD
(dampening 0). float32 and float64 steps run as one fused kernel (pullback.kernels.updates),
weight decay included; other dtypes run the same arithmetic in NumPy."""

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


class SGD(GradApplyer):
    """`p -= lr * g`, or with momentum `buf = momentum * buf + g` (buf = g at the first
    step) and `p -= lr * buf` (Nesterov: `p -= lr * (g + momentum * buf)`).
    `weight_decay` adds `weight_decay * p` to the gradient first, as PyTorch does.
    Each may differ per parameter group."""

    _buffer_names: ClassVar[tuple[str, ...]] = ("momentum",)
    momentum = _Default[float]()
    nesterov = _Default[bool]()
    weight_decay = _Default[float]()

    def __init__(self, params: Params, lr: float | TrainParams, momentum: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0) -> None:
        super().__init__(params, lr, momentum=momentum, nesterov=nesterov,
                         weight_decay=weight_decay)

    @staticmethod
    def _check_group(where: str, group: Mapping[str, Any]) -> dict[str, Any]:
        momentum = real(where, "momentum", group["momentum"], low=0.0)
        nesterov = group["nesterov"]
        if not isinstance(nesterov, bool):
            raise TypeError(f"{where}: nesterov must be True or False, got {nesterov!r}")
        if nesterov and momentum == 0.0:
            raise ValueError(f"{where}: nesterov momentum needs momentum > 0")
        return {"lr": real(where, "lr", group["lr"], low=0.0), "momentum": momentum,
                "nesterov": nesterov,
                "weight_decay": real(where, "weight_decay", group["weight_decay"], low=0.0)}

    def _buffers_for(self, group: Mapping[str, Any]) -> tuple[str, ...]:
        return ("momentum",) if group["momentum"] else ()

    def _rule(self, index: int, param: np.ndarray, grad: np.ndarray, lr: float, scale: float,
              tmp: np.ndarray, out: np.ndarray, group: dict[str, Any]) -> None:
        fused = param.dtype in SUPPORTED_DTYPES
        momentum, decay = group["momentum"], group["weight_decay"]
        if not momentum:
            if fused:
                self._fused(index, updates.sgd_update, (param, grad, lr * scale, decay),
                            (param,))
                return
            if decay:
                grad = np.add(grad, np.multiply(param, decay, out=tmp), out=tmp)
            self._subtract(param, np.multiply(grad, lr, out=out), scale)
            return
        state = self._state.setdefault(index, {})
        buf = state.get("momentum")
        first = buf is None
        if buf is None:
            # PyTorch starts the buffer at the first gradient, not at zero.
            buf = state["momentum"] = np.empty(param.shape, param.dtype)
        if fused:
            self._fused(index, updates.sgd_momentum_update,
                        (param, grad, buf, lr * scale, momentum, decay, first,
                         group["nesterov"]), (param, buf))
            return
        if decay:
            grad = np.add(grad, np.multiply(param, decay, out=tmp), out=tmp)
        if first:
            np.copyto(buf, grad)
        else:
            np.multiply(buf, momentum, out=buf)
            np.add(buf, grad, out=buf)
        if group["nesterov"]:
            np.add(grad, np.multiply(buf, momentum, out=out), out=out)
            grad = out
        else:
            grad = buf
        self._subtract(param, np.multiply(grad, lr, out=out), scale)
