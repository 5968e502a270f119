"""Average pooling layers: AvgPool2d and AdaptiveAvgPool2d, PyTorch's, over
`pb.avg_pool2d` (which exports to ONNX as AveragePool)."""

from __future__ import annotations

from .. import ops
from ..ops.hints import TensorLike
from ..tensor import Tensor
from .module import Module


class AvgPool2d(Module):
    """Mean over each window of (N, C, H, W), padding counted as zeros, as PyTorch's
    AvgPool2d (count_include_pad=True); `stride` defaults to `kernel_size`."""

    def __init__(self, kernel_size: int | tuple[int, int],
                 stride: int | tuple[int, int] | None = None,
                 padding: int | tuple[int, int] = 0) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x: TensorLike) -> Tensor:
        return ops.avg_pool2d(x, self.kernel_size, self.stride, self.padding)

    def extra_repr(self) -> str:
        stride = self.kernel_size if self.stride is None else self.stride
        return f"kernel_size={self.kernel_size}, stride={stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """Mean pooling of (N, C, H, W) to (N, C, *output_size), as PyTorch's
    AdaptiveAvgPool2d, for output sizes that divide the input's height and width (1, the
    global average, always does): then every window has the same size, and the pool is
    an AvgPool2d with kernel and stride H / out_h, W / out_w. A None entry keeps that
    axis's size."""

    def __init__(self, output_size: int | tuple[int | None, int | None] | None) -> None:
        super().__init__()
        sizes = (output_size, output_size) if output_size is None or isinstance(
            output_size, int) else tuple(output_size)
        if len(sizes) != 2 or not all(s is None or (isinstance(s, int) and s > 0)
                                      for s in sizes):
            raise ValueError(f"AdaptiveAvgPool2d: output_size must be a positive int, or a "
                             f"pair of positive ints or None, not {output_size!r}")
        self.output_size = output_size
        self._sizes = sizes

    def forward(self, x: TensorLike) -> Tensor:
        shape = tuple(getattr(x, "shape", ()))
        if len(shape) != 4:
            raise ValueError(f"AdaptiveAvgPool2d: expected a 4-D input (N, C, H, W), got "
                             f"shape {shape}")
        out = tuple(size if want is None else want for size, want in zip(shape[2:], self._sizes))
        if any(size % want for size, want in zip(shape[2:], out)):
            raise ValueError(f"AdaptiveAvgPool2d: output size {out} from an input of height "
                             f"and width {shape[2:]}: only output sizes that divide the "
                             "input's height and width evenly are supported (windows of "
                             "unequal sizes are not)")
        kernel = tuple(size // want for size, want in zip(shape[2:], out))
        return ops.avg_pool2d(x, kernel, kernel)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
