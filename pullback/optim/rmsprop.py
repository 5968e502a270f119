"""RMSProp, with or without momentum, as torch.optim.RMSprop (centered=False);
`beta` is PyTorch's `alpha`. float32 and float64 steps run as one fused kernel
(pullback.kernels.updates); other dtypes run the same arithmetic in NumPy."""

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


class RMSProp(GradApplyer):
    """`v = beta * v + (1 - beta) * g * g`; `p -= lr * g / (sqrt(v) + eps)`, or with
    momentum `buf = momentum * buf + g / (sqrt(v) + eps)` and `p -= lr * buf`."""

    def __init__(self, params: Iterable[Tensor], lr: float | TrainParams, beta: float = 0.9,
                 momentum: float = 0.0, eps: float = 1e-8) -> None:
        super().__init__(params, lr)
        self.beta = real("RMSProp", "beta", beta, low=0.0, high=1.0, high_open=True)
        self.momentum = real("RMSProp", "momentum", momentum, low=0.0)
        self.eps = real("RMSProp", "eps", eps, low=0.0)
        self._buffer_names = ("square_avg", "momentum") if self.momentum else ("square_avg",)

    def _hyper(self) -> dict[str, Any]:
        return {"beta": self.beta, "momentum": self.momentum, "eps": self.eps}

    def _rule(self, index: int, param: np.ndarray, grad: np.ndarray, lr: float, scale: float,
              tmp: np.ndarray, out: np.ndarray) -> None:
        state = self._state.get(index)
        if state is None:
            state = self._state[index] = self._new_state(param)
        square_avg = state["square_avg"]
        if param.dtype in SUPPORTED_DTYPES:
            if self.momentum:
                buf = state["momentum"]
                self._fused(index, updates.rmsprop_momentum_update,
                            (param, grad, square_avg, buf, lr * scale, self.beta, 1.0 - self.beta,
                             self.eps, self.momentum), (param, square_avg, buf))
            else:
                self._fused(index, updates.rmsprop_update,
                            (param, grad, square_avg, lr * scale, self.beta, 1.0 - self.beta,
                             self.eps), (param, square_avg))
            return
        np.multiply(square_avg, self.beta, out=square_avg)
        # ((1 - beta) * g) * g, in PyTorch's addcmul order, so f32 results agree closely.
        np.multiply(grad, 1.0 - self.beta, out=tmp)
        np.add(square_avg, np.multiply(tmp, grad, out=tmp), out=square_avg)
        avg = np.add(np.sqrt(square_avg, out=tmp), self.eps, out=tmp)
        if self.momentum:
            buf = state["momentum"]
            np.multiply(buf, self.momentum, out=buf)
            np.add(buf, np.divide(grad, avg, out=out), out=buf)
            self._subtract(param, np.multiply(buf, lr, out=out), scale)
            return
        self._subtract(param, np.divide(np.multiply(grad, lr, out=out), avg, out=out), scale)
