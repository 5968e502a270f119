"""Layers with parameters: Dense, Bias1d, Conv2d, GLU, LayerNorm.

Each traces and backprops by the default path: the graph the autodiff core records,
run backwards from the ops' rules (and the backend's fused backward kernels where
it has them), so no layer writes a derivative of its own. Initializations are
PyTorch's.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .. import ops
from ..ops.hints import DTypeLike, Shape, TensorLike
from ..tensor import Tensor, ones, rand, zeros
from .module import Module, Parameter


def uniform(shape: Shape, bound: float, dtype: DTypeLike) -> Tensor:
    """U(-bound, bound) from pullback's global generator (`pb.manual_seed`)."""
    return Parameter((rand(*shape, dtype=dtype) * 2.0 - 1.0) * bound)


def check_sizes(layer: str, **sizes: object) -> None:
    """Each size a non-negative int, or a ValueError naming the layer and the argument
    (not a math domain error from the initializer's square root)."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{layer}: {name} must be a non-negative int, got {value!r}")


class Dense(Module):
    """y = x @ weight.T + bias, weight of shape (out_features, in_features), as PyTorch."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: DTypeLike = np.float32) -> None:
        super().__init__()
        check_sizes(type(self).__name__, in_features=in_features, out_features=out_features)
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        self.weight = uniform((out_features, in_features), bound, dtype)
        self.bias = uniform((out_features,), bound, dtype) if bias else None

    def forward(self, x: TensorLike) -> Tensor:
        y = ops.matmul(x, ops.transpose(self.weight))
        return ops.add(y, self.bias) if self.bias is not None else y

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class Bias1d(Module):
    """y = x + bias, a learnable bias over the last axis (initialized to zero)."""

    def __init__(self, n: int, dtype: DTypeLike = np.float32) -> None:
        super().__init__()
        self.bias = Parameter(zeros(n, dtype=dtype))

    def forward(self, x: TensorLike) -> Tensor:
        return ops.add(x, self.bias)

    def extra_repr(self) -> str:
        return str(self.bias.shape[0])


class Conv2d(Module):
    """2-D convolution, NCHW input, weight (out, in / groups, kh, kw), as PyTorch's
    Conv2d (zero padding, symmetric per axis), with PyTorch's initialization."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int],
                 stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
                 bias: bool = True, dtype: DTypeLike = np.float32,
                 dilation: int | tuple[int, int] = 1, groups: int = 1) -> None:
        super().__init__()
        check_sizes("Conv2d", in_channels=in_channels, out_channels=out_channels)
        kh, kw = ops.conv.pair("Conv2d", kernel_size, "kernel_size")
        self.stride = ops.conv.pair("Conv2d", stride, "stride")
        self.padding = ops.conv.pair("Conv2d", padding, "padding")
        self.dilation = ops.conv.pair("Conv2d", dilation, "dilation")
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise ValueError(f"Conv2d: groups must be a positive int, not {groups!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: groups {groups} must divide both in_channels "
                             f"{in_channels} and out_channels {out_channels}")
        self.groups = groups
        fan_in = in_channels // groups * kh * kw
        bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
        self.weight = uniform((out_channels, in_channels // groups, kh, kw), bound, dtype)
        self.bias = uniform((out_channels,), bound, dtype) if bias else None

    def _geometry(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], int]:
        return self.stride, self.padding, self.dilation, self.groups

    def forward(self, x: TensorLike) -> Tensor:
        return ops.conv2d(x, self.weight, self.bias, *self._geometry())

    def extra_repr(self) -> str:
        o, i, kh, kw = self.weight.shape
        text = (f"{i * self.groups}, {o}, kernel_size={(kh, kw)}, stride={self.stride}, "
                f"padding={self.padding}")
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text


class GLU(Module):
    """Gated linear unit: `proj` maps to 2 * out_features, then `a * activation(b)` of its
    halves. The default gate, sigmoid, is PyTorch's `nn.GLU(dim=-1)` after a Linear;
    `activation` may be another elementwise function of a tensor (`pb.silu` gives
    SwiGLU, `pb.gelu` GEGLU) or a parameterless module such as `nn.SiLU()`."""

    def __init__(self, in_features: int, out_features: int, dtype: DTypeLike = np.float32,
                 activation: Callable[[Tensor], Tensor] = ops.sigmoid) -> None:
        super().__init__()
        if not callable(activation):
            raise TypeError(f"GLU: activation must be callable on a tensor (pb.sigmoid, "
                            f"pb.silu, nn.GELU(), ...), not {type(activation).__name__}")
        self.out_features = out_features
        self.proj = Dense(in_features, 2 * out_features, dtype=dtype)
        self.activation = activation

    def forward(self, x: TensorLike) -> Tensor:
        h = self.proj(x)
        n = self.out_features
        return ops.mul(h[..., :n], self.activation(h[..., n:]))

    def extra_repr(self) -> str:
        if self.activation is ops.sigmoid or isinstance(self.activation, Module):
            return ""  # the default gate, or a module gate, which shows as a child
        return f"activation={getattr(self.activation, '__name__', self.activation)}"


class LayerNorm(Module):
    """Normalize over the last axis, then scale and shift (PyTorch's LayerNorm(n))."""

    def __init__(self, n: int, eps: float = 1e-5, dtype: DTypeLike = np.float32) -> None:
        super().__init__()
        self.eps = eps
        self.weight = Parameter(ones(n, dtype=dtype))
        self.bias = Parameter(zeros(n, dtype=dtype))

    def forward(self, x: TensorLike) -> Tensor:
        return ops.layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
