"""Modules without parameters: activations, Identity, Flatten, MaxPool2d, Dropout.

They trace through the autodiff core (the default path) and differentiate by
the primitives' rules and fused kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ops
from ..ops.hints import TensorLike
from ..tensor import Tensor
from ..tensor.creation import default_generator
from .module import Module


class Identity(Module):
    """Returns its input unchanged (a placeholder, as PyTorch's; arguments are ignored)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    # A Tensor, not a type variable: `Module.__call__` reads forward's signature, which a
    # generic forward would leave unsolved.
    def forward(self, x: Tensor) -> Tensor:
        return x


class ReLU(Module):
    def forward(self, x: TensorLike) -> Tensor:
        return ops.relu(x)


class Sigmoid(Module):
    def forward(self, x: TensorLike) -> Tensor:
        return ops.sigmoid(x)


class Tanh(Module):
    def forward(self, x: TensorLike) -> Tensor:
        return ops.tanh(x)


class SiLU(Module):
    """x * sigmoid(x)."""

    def forward(self, x: TensorLike) -> Tensor:
        return ops.silu(x)


class Softmax(Module):
    """Softmax along `dim` (required: PyTorch's implicit choice is deprecated)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: TensorLike) -> Tensor:
        return ops.softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """log(softmax(x)) along `dim`, computed stably."""

    def forward(self, x: TensorLike) -> Tensor:
        return ops.log_softmax(x, self.dim)


class GELU(Module):
    """GELU, exact (erf) by default; `approximate="tanh"` for the approximation."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: TensorLike) -> Tensor:
        return ops.gelu(x, self.approximate)


class Flatten(Module):
    """Flatten every axis from `start_dim` on (the batch axis stays)."""

    def __init__(self, start_dim: int = 1) -> None:
        super().__init__()
        self.start_dim = start_dim

    def forward(self, x: Tensor) -> Tensor:
        shape = tuple(x.shape)
        return ops.reshape(x, shape[: self.start_dim] + (-1,))


class MaxPool2d(Module):
    def __init__(self, kernel_size: int | tuple[int, int],
                 stride: int | tuple[int, int] | None = None,
                 padding: int | tuple[int, int] = 0) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x: TensorLike) -> Tensor:
        return ops.max_pool2d(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size}"


class Dropout(Module):
    """Zero each element with probability `p` in training and scale the rest by 1/(1-p);
    the identity in eval mode. Masks come from pullback's global generator
    (`pb.manual_seed`), or from this module's own when `seed` is given."""

    def __init__(self, p: float = 0.5, seed: int | None = None) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1), not {p}")
        self.p = p
        self._rng = np.random.default_rng(seed) if seed is not None else None

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        # The mask is an op that draws when it runs, so a lowered plan draws afresh.
        rng = (lambda: self._generator()) if self._rng is not None else default_generator
        return ops.mul(x, ops.dropout_mask(x, self.p, rng))

    def _generator(self) -> np.random.Generator:
        """This module's own generator, read when the mask is drawn (forward passes this
        only to a module that has one)."""
        assert self._rng is not None
        return self._rng

    def extra_repr(self) -> str:
        return f"p={self.p}"
