"""Sorting: `argsort` (a primitive, integer result, no gradient), and `sort` and `topk`,
whose values are the input read at those indices (a `getitem`, so their gradient is a
scatter into the sorted positions and the indices stay an operand a plan reads anew)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import KernelError
from .checks import declare_check, distinct, inputs
from .hints import Shape, TensorLike
from .registry import declare, normalize_axes, shape_of, tensor_method
from .shape import getitem, reshape

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["argsort", "sort", "topk"]


def _argsort_shape(x: Any, axis: int, descending: bool) -> tuple[Shape, np.dtype[Any]]:
    return shape_of(x), np.dtype(np.int64)


argsort_p = declare("argsort",
                    lambda backend, x, axis, descending: backend.argsort(x, axis, descending),
                    _argsort_shape, differentiable=False, aliasing="fresh")


def _one_axis(op: str, x: TensorLike, axis: int) -> int | None:
    """`axis` as a non-negative int; None for a 0-d tensor (its axis 0 or -1 is itself)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise KernelError(op, (x,), f"axis must be an int, not {axis!r}")
    axes = normalize_axes(op, x, int(axis))
    return axes[0] if axes else None


def _indices(x: TensorLike, axis: int | None, descending: bool) -> Tensor:
    if axis is None:  # a 0-d tensor sorts to itself, at index 0
        return reshape(argsort_p.bind(reshape(x, (1,)), axis=0, descending=descending), ())
    return argsort_p.bind(x, axis=axis, descending=descending)


def _along(x: TensorLike, indices: Tensor, axis: int | None) -> Tensor:
    """x[..., indices, ...] along `axis`, as take_along_axis: `indices` has x's shape except
    along `axis`; the other axes are open ranges that broadcast against it. A 0-d x (axis
    None) is its own result (a tensor made of it where it is an array)."""
    if axis is None:
        return reshape(x, ())
    shape = shape_of(indices)
    index = tuple(indices if a == axis else
                  np.arange(shape[a]).reshape([-1 if b == a else 1 for b in range(len(shape))])
                  for a in range(len(shape)))
    return getitem(x, index)


@tensor_method(argsort_p)
def argsort(x: TensorLike, axis: int = -1, descending: bool = False) -> Tensor:
    """int64 indices that sort `x` along `axis`, as torch.argsort with stable=True (equal
    values keep their order); NaN sorts as the largest value. No gradient."""
    return _indices(x, _one_axis("argsort", x, axis), bool(descending))


def sort(x: TensorLike, axis: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
    """(values, indices) sorted along `axis`, ascending unless `descending`, as
    torch.sort with stable=True; the values carry the gradient to where they came from."""
    a = _one_axis("sort", x, axis)
    indices = _indices(x, a, bool(descending))
    return _along(x, indices, a), indices


def topk(x: TensorLike, k: int, axis: int = -1, largest: bool = True,
         sorted: bool = True) -> tuple[Tensor, Tensor]:
    """(values, indices) of the `k` largest (smallest unless `largest`) elements along
    `axis`, as torch.topk, in order; equal values come by index. The values carry the
    gradient to where they came from. `sorted` is accepted for PyTorch's sake: the
    result is always sorted. A 0-d tensor is its own top element, as in PyTorch."""
    a = _one_axis("topk", x, axis)
    size = 1 if a is None else shape_of(x)[a]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= size:
        raise KernelError("topk", (x,), f"k must be an int from 0 to {size} (the size of axis "
                          f"{axis}), not {k!r}")
    indices = _indices(x, a, bool(largest))
    if a is not None and k < size:
        indices = getitem(indices, (slice(None),) * a + (slice(0, int(k)),))
    return _along(x, indices, a), indices


# ---------------------------------------------------------------- samples for `pullback check`

declare_check(argsort_p, lambda x: argsort(x, axis=0), inputs(distinct(4, 3)),
              reference=lambda x: np.argsort(x, axis=0))
