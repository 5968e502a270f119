"""The names annotations use across pullback, so that an editor and mypy know what an
op takes and gives: `def tanh(x: TensorLike) -> Tensor`. `ArrayLike` (what `pb.tensor`
takes, nested lists included) and `DTypeLike` are NumPy's.

The ops sit below `tensor` in the layer table, yet what they return is a `Tensor` (or,
inside transforms and plans, an object that behaves as one). `Tensor` is imported here
for type checkers only (`TYPE_CHECKING`), an import that never runs; the import contract
ignores such imports (`exclude_type_checking_imports` in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

if TYPE_CHECKING:
    from ..tensor import Tensor

__all__ = ["ArrayLike", "Axis", "DTypeLike", "Shape", "TensorLike"]

# What an op accepts as an operand: a tensor, a NumPy array or scalar of a real or bool
# dtype, a Python number. Not a list: ops refuse one (naming the op) rather than guess
# its dtype; `pb.tensor([...])` makes a tensor of it.
TensorLike = Union["Tensor", NDArray[Any], np.generic, bool, int, float]

# One axis, several, or None for all of them (`sum(x, axis=None)`).
Axis = int | Sequence[int] | None

# A shape as pullback gives it (`x.shape`); ops that take one accept any int sequence.
Shape = tuple[int, ...]
