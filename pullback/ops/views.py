"""PyTorch's spellings of reshapes and slices: squeeze, unsqueeze, flatten, permute,
split, chunk and unbind. Each is a reshape, a transpose or getitems, checked here so
that an error names the op the user called."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

from ..errors import KernelError
from .hints import Axis, TensorLike
from .registry import normalize_axes, shape_of
from .shape import getitem, reshape, transpose

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["chunk", "flatten", "permute", "split", "squeeze", "unbind", "unsqueeze"]


def _is_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _axis(op: str, x: TensorLike, axis: object, ndim: int | None = None) -> int:
    """`axis` as a non-negative int below `ndim` (x's number of dimensions unless given)."""
    ndim = len(shape_of(x)) if ndim is None else ndim
    if not _is_int(axis):
        raise KernelError(op, (x,), f"axis must be an int, not {axis!r}")
    if not -ndim <= axis < ndim:
        raise KernelError(op, (x,), f"axis {axis} is out of range for {ndim} dimensions")
    return int(axis) % ndim


def squeeze(x: TensorLike, axis: Axis = None) -> Tensor:
    """x without its size-1 dimensions (None: all of them; an int or a tuple: those, where
    they have size 1, as torch.squeeze leaves the others)."""
    shape = shape_of(x)
    if axis is None:
        axes = tuple(range(len(shape)))
    else:
        axes = normalize_axes("squeeze", x, axis)
    return reshape(x, tuple(d for a, d in enumerate(shape) if a not in axes or d != 1))


def unsqueeze(x: TensorLike, axis: int) -> Tensor:
    """x with a new size-1 dimension at `axis` (-1: the last of the result)."""
    shape = shape_of(x)
    a = _axis("unsqueeze", x, axis, len(shape) + 1)
    return reshape(x, shape[:a] + (1,) + shape[a:])


def flatten(x: TensorLike, start_axis: int = 0, end_axis: int = -1) -> Tensor:
    """x with dimensions `start_axis` to `end_axis` (both included) merged into one, as
    torch.flatten; a 0-d tensor becomes a 1-element vector."""
    shape = shape_of(x)
    if not shape:
        for axis in (start_axis, end_axis):
            _axis("flatten", x, axis, 1)
        return reshape(x, (1,))
    start, end = _axis("flatten", x, start_axis), _axis("flatten", x, end_axis)
    if start > end:
        raise KernelError("flatten", (x,), f"start_axis {start_axis} comes after end_axis "
                          f"{end_axis}")
    merged = math.prod(shape[start:end + 1])
    return reshape(x, shape[:start] + (merged,) + shape[end + 1:])


def permute(x: TensorLike, *axes: int | Sequence[int]) -> Tensor:
    """x with its dimensions in the order `axes` (ints, or one tuple), as torch.permute."""
    order: tuple[Any, ...] = axes
    if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
        order = tuple(axes[0])
    ndim = len(shape_of(x))
    if not all(_is_int(a) and -ndim <= a < max(ndim, 1) for a in order) or \
            sorted(int(a) % max(ndim, 1) for a in order) != list(range(ndim)):
        raise KernelError("permute", (x,), f"axes {order} are not a permutation of {ndim} "
                          "dimensions")
    return transpose(x, tuple(int(a) % ndim for a in order))


def split(x: TensorLike, sections: int | Sequence[int], axis: int = 0) -> tuple[Tensor, ...]:
    """x cut along `axis` into pieces of `sections` elements (the last may be smaller), or
    of each size in the list `sections`, as torch.split."""
    a = _axis("split", x, axis)
    size = shape_of(x)[a]
    if _is_int(sections):
        if sections < 0 or (sections == 0 and size):
            raise KernelError("split", (x,), f"a piece's size must be a positive int, not "
                              f"{sections!r}")
        step = int(sections)
        sizes = [min(step, size - start) for start in range(0, size, step)] if size else [0]
    elif isinstance(sections, (list, tuple)) and all(_is_int(s) and s >= 0 for s in sections):
        sizes = [int(s) for s in sections]
        if sum(sizes) != size:
            raise KernelError("split", (x,), f"sizes {tuple(sizes)} add up to {sum(sizes)}, "
                              f"not to {size} (axis {axis})")
    else:
        raise KernelError("split", (x,), f"sections must be an int or a list of "
                          f"non-negative ints, not {sections!r}")
    return _pieces(x, a, sizes)


def _pieces(x: TensorLike, axis: int, sizes: list[int]) -> tuple[Tensor, ...]:
    pieces, start = [], 0
    for n in sizes:
        pieces.append(getitem(x, (slice(None),) * axis + (slice(start, start + n),)))
        start += n
    return tuple(pieces)


def chunk(x: TensorLike, chunks: int, axis: int = 0) -> tuple[Tensor, ...]:
    """x cut along `axis` into at most `chunks` pieces of equal size (the last may be
    smaller), as torch.chunk."""
    a = _axis("chunk", x, axis)
    if not _is_int(chunks) or chunks <= 0:
        raise KernelError("chunk", (x,), f"chunks must be a positive int, not {chunks!r}")
    size = shape_of(x)[a]
    if size == 0:
        return _pieces(x, a, [0] * int(chunks))
    step = -(-size // chunks)
    return _pieces(x, a, [min(step, size - start) for start in range(0, size, step)])


def unbind(x: TensorLike, axis: int = 0) -> tuple[Tensor, ...]:
    """The slices of x along `axis`, each without that dimension, as torch.unbind."""
    a = _axis("unbind", x, axis)
    return tuple(getitem(x, (slice(None),) * a + (i,)) for i in range(shape_of(x)[a]))
