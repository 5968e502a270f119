"""PyTorch's spellings as tensor methods (`x.permute(0, 2, 1)`, `x.view(-1)`,
`x.float()`, `x.topk(3)`): each calls the op of the same name. Methods that are
primitives come from the primitives themselves (`tensor_method`); these are the ones
composed of several, shared by `Tensor` and the linear variables of transforms.

Arguments keep pullback's names (`axis`, `keepdims`) where an op has them; PyTorch's
`x.min(dim)` and `x.max(dim)` give values and indices, pullback's the values only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from .. import ops

if TYPE_CHECKING:
    from ..ops.hints import Axis, Shape, TensorLike
    from .eager import Tensor


class TorchMethods:
    """The composed methods; `Tensor` and `LinearVar` inherit or copy them (so `self` is
    annotated `Any`: a tensor or a linear variable, which the ops accept)."""

    __slots__ = ()

    # ------------------------------------------------------------ shapes

    def view(self: Any, *shape: int | Sequence[int]) -> Tensor:
        """The same values in `shape` (one entry may be -1), as `reshape`."""
        return ops.reshape(self, *shape)

    def permute(self: Any, *axes: int | Sequence[int]) -> Tensor:
        return ops.permute(self, *axes)

    def unsqueeze(self: Any, axis: int) -> Tensor:
        return ops.unsqueeze(self, axis)

    def squeeze(self: Any, axis: Axis = None) -> Tensor:
        return ops.squeeze(self, axis)

    def flatten(self: Any, start_axis: int = 0, end_axis: int = -1) -> Tensor:
        return ops.flatten(self, start_axis, end_axis)

    def split(self: Any, sections: int | Sequence[int], axis: int = 0) -> tuple[Tensor, ...]:
        return ops.split(self, sections, axis)

    def chunk(self: Any, chunks: int, axis: int = 0) -> tuple[Tensor, ...]:
        return ops.chunk(self, chunks, axis)

    def unbind(self: Any, axis: int = 0) -> tuple[Tensor, ...]:
        return ops.unbind(self, axis)

    def tril(self: Any, k: int = 0) -> Tensor:
        return ops.tril(self, k)

    def triu(self: Any, k: int = 0) -> Tensor:
        return ops.triu(self, k)

    def masked_fill(self: Any, mask: TensorLike, value: TensorLike) -> Tensor:
        return ops.masked_fill(self, mask, value)

    # ------------------------------------------------------------ reductions

    def var(self: Any, axis: Axis = None, keepdims: bool = False, *,
            correction: float = 1) -> Tensor:
        return ops.var(self, axis, keepdims, correction=correction)

    def std(self: Any, axis: Axis = None, keepdims: bool = False, *,
            correction: float = 1) -> Tensor:
        return ops.std(self, axis, keepdims, correction=correction)

    def norm(self: Any, p: float | Literal["fro"] = 2, axis: Axis = None, keepdims: bool = False
             ) -> Tensor:
        return ops.norm(self, p, axis, keepdims)

    def any(self: Any, axis: Axis = None, keepdims: bool = False) -> Tensor:
        return ops.any(self, axis, keepdims)

    def all(self: Any, axis: Axis = None, keepdims: bool = False) -> Tensor:
        return ops.all(self, axis, keepdims)

    def sort(self: Any, axis: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
        return ops.sort(self, axis, descending)

    def topk(self: Any, k: int, axis: int = -1, largest: bool = True, sorted: bool = True
             ) -> tuple[Tensor, Tensor]:
        return ops.topk(self, k, axis, largest, sorted)

    # ------------------------------------------------------------ dtype conversions

    def float(self: Any) -> Tensor:
        """As float32 (PyTorch's `x.float()`)."""
        return ops.astype(self, np.dtype(np.float32))

    def double(self: Any) -> Tensor:
        """As float64."""
        return ops.astype(self, np.dtype(np.float64))

    def long(self: Any) -> Tensor:
        """As int64."""
        return ops.astype(self, np.dtype(np.int64))

    def int(self: Any) -> Tensor:
        """As int32."""
        return ops.astype(self, np.dtype(np.int32))

    def bool(self: Any) -> Tensor:
        """As bool (nonzero is True)."""
        return ops.astype(self, np.dtype(np.bool_))


class ElementCount(int):
    """`Tensor.size`: the element count, as NumPy's `a.size`, that can also be called as
    PyTorch's `x.size()` (the shape) and `x.size(axis)` (one dimension's length)."""

    shape: Shape

    def __new__(cls, shape: Shape) -> ElementCount:
        count = 1
        for d in shape:
            count *= d
        self = super().__new__(cls, count)
        self.shape = shape
        return self

    @overload
    def __call__(self, axis: None = None) -> Shape: ...

    @overload
    def __call__(self, axis: int | np.integer[Any]) -> int: ...

    def __call__(self, axis: int | np.integer[Any] | None = None) -> Shape | int:
        if axis is None:
            return self.shape
        ndim = len(self.shape)
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or \
                not -ndim <= axis < ndim:
            raise IndexError(f"size: axis {axis!r} is out of range for {ndim} dimensions "
                             f"(shape {self.shape})")
        return self.shape[axis]
