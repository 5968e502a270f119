"""PyTorch's spellings as tensor methods (`x.permute(0, 2, 1)`, `x.view(-1)`,
`x.float()`, `x.topk(3)`): each calls the op of the same name. Methods that are
primitives come from the primitives themselves (`tensor_method`); these are the ones
composed of several, shared by `Tensor` and the linear variables of transforms.

Arguments keep pullback's names (`axis`, `keepdims`) where an op has them; PyTorch's
`x.min(dim)` and `x.max(dim)` give values and indices, pullback's the values only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ops


class TorchMethods:
    """The composed methods; `Tensor` and `LinearVar` inherit or copy them."""

    __slots__ = ()

    # ------------------------------------------------------------ shapes

    def view(self, *shape: Any) -> Any:
        """The same values in `shape` (one entry may be -1), as `reshape`."""
        return ops.reshape(self, *shape)

    def permute(self, *axes: Any) -> Any:
        return ops.permute(self, *axes)

    def unsqueeze(self, axis: int) -> Any:
        return ops.unsqueeze(self, axis)

    def squeeze(self, axis: Any = None) -> Any:
        return ops.squeeze(self, axis)

    def flatten(self, start_axis: int = 0, end_axis: int = -1) -> Any:
        return ops.flatten(self, start_axis, end_axis)

    def split(self, sections: Any, axis: int = 0) -> tuple:
        return ops.split(self, sections, axis)

    def chunk(self, chunks: int, axis: int = 0) -> tuple:
        return ops.chunk(self, chunks, axis)

    def unbind(self, axis: int = 0) -> tuple:
        return ops.unbind(self, axis)

    def tril(self, k: int = 0) -> Any:
        return ops.tril(self, k)

    def triu(self, k: int = 0) -> Any:
        return ops.triu(self, k)

    def masked_fill(self, mask: Any, value: Any) -> Any:
        return ops.masked_fill(self, mask, value)

    # ------------------------------------------------------------ reductions

    def var(self, axis: Any = None, keepdims: bool = False, *, correction: float = 1) -> Any:
        return ops.var(self, axis, keepdims, correction=correction)

    def std(self, axis: Any = None, keepdims: bool = False, *, correction: float = 1) -> Any:
        return ops.std(self, axis, keepdims, correction=correction)

    def norm(self, p: Any = 2, axis: Any = None, keepdims: bool = False) -> Any:
        return ops.norm(self, p, axis, keepdims)

    def any(self, axis: Any = None, keepdims: bool = False) -> Any:
        return ops.any(self, axis, keepdims)

    def all(self, axis: Any = None, keepdims: bool = False) -> Any:
        return ops.all(self, axis, keepdims)

    def sort(self, axis: int = -1, descending: bool = False) -> tuple:
        return ops.sort(self, axis, descending)

    def topk(self, k: int, axis: int = -1, largest: bool = True, sorted: bool = True) -> tuple:
        return ops.topk(self, k, axis, largest, sorted)

    # ------------------------------------------------------------ dtype conversions

    def float(self) -> Any:
        """As float32 (PyTorch's `x.float()`)."""
        return ops.astype(self, np.dtype(np.float32))

    def double(self) -> Any:
        """As float64."""
        return ops.astype(self, np.dtype(np.float64))

    def long(self) -> Any:
        """As int64."""
        return ops.astype(self, np.dtype(np.int64))

    def int(self) -> Any:
        """As int32."""
        return ops.astype(self, np.dtype(np.int32))

    def bool(self) -> Any:
        """As bool (nonzero is True)."""
        return ops.astype(self, np.dtype(np.bool_))


class ElementCount(int):
    """`Tensor.size`: the element count, as NumPy's `a.size`, that can also be called as
    PyTorch's `x.size()` (the shape) and `x.size(axis)` (one dimension's length)."""

    def __new__(cls, shape: tuple) -> ElementCount:
        count = 1
        for d in shape:
            count *= d
        self = super().__new__(cls, count)
        self.shape = shape
        return self

    def __call__(self, axis: Any = None) -> Any:
        if axis is None:
            return self.shape
        ndim = len(self.shape)
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or \
                not -ndim <= axis < ndim:
            raise IndexError(f"size: axis {axis!r} is out of range for {ndim} dimensions "
                             f"(shape {self.shape})")
        return self.shape[axis]
