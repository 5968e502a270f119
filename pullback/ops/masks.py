"""Selections by a mask, as `where`s: tril and triu (the mask a constant of the shape),
and masked_fill (the user's bool mask). The gradient is `where`'s: upstream where the
input's value was kept, zero where it was replaced."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from ..errors import KernelError
from .elementwise import where
from .hints import TensorLike
from .registry import broadcast_shapes, dtype_of, shape_of

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["masked_fill", "tril", "triu"]


def _diagonal_mask(op: str, x: TensorLike, k: int, upper: bool) -> NDArray[np.bool_]:
    shape = shape_of(x)
    if len(shape) < 2:
        raise KernelError(op, (x,), "needs at least two dimensions (a matrix, or a batch)")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise KernelError(op, (x,), f"the diagonal offset k must be an int, not {k!r}")
    rows, cols = shape[-2:]
    # np.tri: True on and below diagonal k; the upper triangle from k up is what is left
    # below diagonal k - 1.
    if upper:
        return ~np.tri(rows, cols, int(k) - 1, dtype=np.bool_)
    return np.tri(rows, cols, int(k), dtype=np.bool_)


def tril(x: TensorLike, k: int = 0) -> Tensor:
    """x with the elements above diagonal `k` of its last two dimensions set to 0, as
    torch.tril (k > 0: above the main diagonal, k < 0: below)."""
    return where(_diagonal_mask("tril", x, k, upper=False), x, 0)


def triu(x: TensorLike, k: int = 0) -> Tensor:
    """x with the elements below diagonal `k` of its last two dimensions set to 0, as
    torch.triu."""
    return where(_diagonal_mask("triu", x, k, upper=True), x, 0)


def masked_fill(x: TensorLike, mask: TensorLike, value: TensorLike) -> Tensor:
    """x with `value` (a number or a 0-d tensor) where the bool `mask` (broadcast against
    x) is True, as torch.masked_fill; a 0-d tensor value gets the gradient of the places
    it fills."""
    if str(dtype_of(mask)) != "bool":
        raise KernelError("masked_fill", (x, mask), "the mask must be a bool tensor (a "
                          "comparison such as x > 0 makes one)")
    number = isinstance(value, (bool, int, float, np.number, np.bool_))
    if not number and not (hasattr(value, "shape") and shape_of(value) == ()):
        raise KernelError("masked_fill", (x, mask), f"the value must be a number or a 0-d "
                          f"tensor, not {value!r}")
    broadcast_shapes("masked_fill", x, mask)
    return where(mask, value, x)
