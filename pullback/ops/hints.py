"""The names annotations use across pullback, so that an editor and mypy know what an
op takes and gives: `def tanh(x: TensorLike) -> Tensor`.

The ops sit below `tensor` in the layer table, yet what they return is a `Tensor` (or,
inside transforms and plans, an object that behaves as one). `Tensor` is imported here
for type checkers only (`TYPE_CHECKING`), an import that never runs; the import contract
ignores such imports (`exclude_type_checking_imports` in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Union

from numpy.typing import ArrayLike, DTypeLike

if TYPE_CHECKING:
    from ..tensor import Tensor

__all__ = ["ArrayLike", "Axis", "DTypeLike", "Shape", "TensorLike"]

# What an op accepts as an operand: a tensor, a NumPy array, a nested list, a scalar.
TensorLike = Union["Tensor", ArrayLike]

# One axis, several, or None for all of them (`sum(x, axis=None)`).
Axis = Union[int, Sequence[int], None]

# A shape as pullback gives it (`x.shape`); ops that take one accept any int sequence.
Shape = tuple[int, ...]
