"""SGD with optional momentum, Nesterov momentum and weight decay, as torch.optim.SGD
(dampening 0). float32 and float64 steps run as one fused kernel (pullback.kernels.updates),
weight decay included; other dtypes run the same arithmetic in NumPy."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..kernels import updates
from ..kernels.core import SUPPORTED_DTYPES
from ..tensor import Tensor
from ._checks import real
from .applyer import GradApplyer
from .train_params import TrainParams


class SGD(GradApplyer):
    """`p -= lr * g`, or with momentum `buf = momentum * buf + g` (buf = g at the first
    step) and `p -= lr * buf` (Nesterov: `p -= lr * (g + momentum * buf)`).
    `weight_decay` adds `weight_decay * p` to the gradient first, as PyTorch does."""

    def __init__(self, params: Iterable[Tensor], lr: float | TrainParams, momentum: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0) -> None:
        super().__init__(params, lr)
        self.momentum = real("SGD", "momentum", momentum, low=0.0)
        if not isinstance(nesterov, bool):
            raise TypeError(f"SGD: nesterov must be True or False, got {nesterov!r}")
        if nesterov and self.momentum == 0.0:
            raise ValueError("SGD: nesterov momentum needs momentum > 0")
        self.nesterov = nesterov
        self.weight_decay = real("SGD", "weight_decay", weight_decay, low=0.0)
        # Coupled decay (g + weight_decay * p) happens inside _rule, fused into the step.
        self._buffer_names = ("momentum",) if self.momentum else ()

    def _hyper(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "nesterov": self.nesterov,
                "weight_decay": self.weight_decay}

    def _rule(self, index: int, param: np.ndarray, grad: np.ndarray, lr: float, scale: float,
              tmp: np.ndarray, out: np.ndarray) -> None:
        fused = param.dtype in SUPPORTED_DTYPES
        if not self.momentum:
            if fused:
                self._fused(index, updates.sgd_update,
                            (param, grad, lr * scale, self.weight_decay), (param,))
                return
            if self.weight_decay:
                grad = np.add(grad, np.multiply(param, self.weight_decay, out=tmp), out=tmp)
            self._subtract(param, np.multiply(grad, lr, out=out), scale)
            return
        state = self._state.get(index)
        first = state is None
        if first:
            # PyTorch starts the buffer at the first gradient, not at zero.
            buf = np.empty(param.shape, param.dtype)
            self._state[index] = {"momentum": buf}
        else:
            buf = state["momentum"]
        if fused:
            self._fused(index, updates.sgd_momentum_update,
                        (param, grad, buf, lr * scale, self.momentum, self.weight_decay, first,
                         self.nesterov), (param, buf))
            return
        if self.weight_decay:
            grad = np.add(grad, np.multiply(param, self.weight_decay, out=tmp), out=tmp)
        if first:
            np.copyto(buf, grad)
        else:
            np.multiply(buf, self.momentum, out=buf)
            np.add(buf, grad, out=buf)
        if self.nesterov:
            np.add(grad, np.multiply(buf, self.momentum, out=out), out=out)
            grad = out
        else:
            grad = buf
        self._subtract(param, np.multiply(grad, lr, out=out), scale)
