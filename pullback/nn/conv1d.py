"""Conv1d: PyTorch's 1-D convolution, run as conv2d over a unit height axis (so it
exports to ONNX as Conv between two Reshapes)."""

from __future__ import annotations

import math

import numpy as np

from .. import ops
from ..ops.hints import DTypeLike, TensorLike
from ..tensor import Tensor
from .layers import check_sizes, uniform
from .module import Module


def _single(value: object, name: str) -> int:
    """An int, or a 1-tuple of one (PyTorch's `_single`), or a ValueError."""
    if isinstance(value, (tuple, list)) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"Conv1d: {name} must be an int (or a 1-tuple), not {value!r}")
    return int(value)


class Conv1d(Module):
    """1-D convolution of (N, C_in, L), weight (out_channels, in_channels / groups,
    kernel_size), zero padding on both ends, as PyTorch's Conv1d, with its
    initialization; arguments in Conv2d's order (`bias` before `dilation` and `groups`,
    which PyTorch's take by keyword in practice)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int],
                 stride: int | tuple[int] = 1, padding: int | tuple[int] = 0, bias: bool = True,
                 dtype: DTypeLike = np.float32, dilation: int | tuple[int] = 1,
                 groups: int = 1) -> None:
        super().__init__()
        check_sizes("Conv1d", in_channels=in_channels, out_channels=out_channels)
        k = _single(kernel_size, "kernel_size")
        self.stride = _single(stride, "stride")
        self.padding = _single(padding, "padding")
        self.dilation = _single(dilation, "dilation")
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise ValueError(f"Conv1d: groups must be a positive int, not {groups!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv1d: groups {groups} must divide both in_channels "
                             f"{in_channels} and out_channels {out_channels}")
        self.groups = groups
        fan_in = in_channels // groups * k
        bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
        self.weight = uniform((out_channels, in_channels // groups, k), bound, dtype)
        self.bias = uniform((out_channels,), bound, dtype) if bias else None

    def forward(self, x: TensorLike) -> Tensor:
        shape = tuple(getattr(x, "shape", ()))
        if len(shape) != 3:
            raise ValueError(f"Conv1d: expected a 3-D input (N, C, L), got shape {shape}")
        o, i, k = self.weight.shape
        y = ops.conv2d(ops.reshape(x, (shape[0], shape[1], 1, shape[2])),
                       ops.reshape(self.weight, (o, i, 1, k)), self.bias,
                       (1, self.stride), (0, self.padding), (1, self.dilation), self.groups)
        return ops.reshape(y, (shape[0], o, y.shape[-1]))

    def extra_repr(self) -> str:
        o, i, k = self.weight.shape
        text = (f"{i * self.groups}, {o}, kernel_size=({k},), stride=({self.stride},), "
                f"padding=({self.padding},)")
        if self.dilation != 1:
            text += f", dilation=({self.dilation},)"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text
