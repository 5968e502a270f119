"""BatchNorm1d and BatchNorm2d: PyTorch's batch normalization layers, over
`pb.batch_norm` (one primitive, fused forward and backward).

Parameters `weight` and `bias` and buffers `running_mean`, `running_var` and
`num_batches_tracked` (int64) carry PyTorch's names, so a PyTorch state dict loads
unchanged. In training mode the running statistics are updated in place, outside
differentiation, as PyTorch updates them; eval mode normalizes with them.
"""

from __future__ import annotations

import numpy as np

from .. import ops
from ..ops.hints import DTypeLike, TensorLike
from ..tensor import Tensor, ones, tensor, zeros
from .layers import check_sizes
from .module import Module, Parameter


class _BatchNorm(Module):
    """What BatchNorm1d and BatchNorm2d share; they differ in the inputs they accept."""

    #: The numbers of dimensions an input may have.
    input_dims: tuple[int, ...] = ()
    # Buffers (register_buffer) when tracking running statistics, else None.
    running_mean: Tensor | None
    running_var: Tensor | None
    num_batches_tracked: Tensor | None

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 dtype: DTypeLike = np.float32) -> None:
        super().__init__()
        name = type(self).__name__
        check_sizes(name, num_features=num_features)
        if momentum is not None and not 0.0 <= momentum <= 1.0:
            raise ValueError(f"{name}: momentum must be in [0, 1] or None (a cumulative "
                             f"average), not {momentum!r}")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(ones(num_features, dtype=dtype)) if affine else None
        self.bias = Parameter(zeros(num_features, dtype=dtype)) if affine else None
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, dtype=dtype))
            self.register_buffer("running_var", ones(num_features, dtype=dtype))
            self.register_buffer("num_batches_tracked", tensor(0, dtype=np.int64))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def forward(self, x: TensorLike) -> Tensor:
        ndim = len(getattr(x, "shape", ()))
        if ndim not in self.input_dims:
            wanted = " or ".join(f"{d}-D" for d in self.input_dims)
            raise ValueError(f"{type(self).__name__}: expected a {wanted} input (N, C, ...) "
                             f"with C = {self.num_features}, got shape "
                             f"{tuple(getattr(x, 'shape', ()))}")
        updates = self.training and self.track_running_stats
        counter = self.num_batches_tracked
        factor: float | Tensor = 0.0
        if updates:
            assert counter is not None and self.running_mean is not None  # tracking keeps them
            if self.momentum is not None:
                factor = self.momentum
            else:
                # The cumulative average, each batch weighing 1 / batches seen: a tensor
                # computed from the counter, so that a plan computes it at every call.
                seen = counter + 1
                factor = (1.0 / seen).astype(self.running_mean.dtype)
        # Batch statistics in training, and in eval too when none are kept (as PyTorch).
        batch_stats = self.training or not self.track_running_stats
        y = ops.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                           training=batch_stats, momentum=factor, eps=self.eps)
        if updates and counter is not None:
            counter.add_(1)
        return y

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalization of (N, C) or (N, C, L) per channel C, as PyTorch's BatchNorm1d."""

    input_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalization of (N, C, H, W) per channel C, as PyTorch's BatchNorm2d."""

    input_dims = (4,)
