"""Gathers along one axis, `take` and `take_along_axis`, and the scatter-adds that are
their transposes.

Each gather is linear in x, so it declares a transpose and no JVP of its own: its
transpose is a scatter-add primitive (repeated indices accumulate), whose transpose is
the gather again. Forward mode, reverse mode and every higher order follow from those
two rules. The integer indices are a parameter, as getitem's index is: never
differentiated, and read anew at each call of a plan when computed from its inputs
(an embedding's token ids). The backends run them as `GatherOps` (NumPy's gathers and
one Numba scatter-add pass on the CPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ..ad import deflinear
from ..backend.gather import gather_ops
from ..errors import KernelError
from .checks import declare_check, inputs, normal
from .hints import Shape, TensorLike
from .registry import declare, dtype_of, normalize_axes, shape_of
from .shape import sum_to_shape

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["take", "take_along_axis"]


def _indices(op: str, x: TensorLike, indices: TensorLike) -> NDArray[Any]:
    """The index array of a tensor, an array, a list or an int (not copied: a plan reads
    a traced array again at each call), or a KernelError unless it holds integers."""
    array = getattr(indices, "_data", indices)
    if not isinstance(array, np.ndarray):
        array = np.asarray(array)
    if array.dtype.kind not in "iu":
        raise KernelError(op, (x, array), "indices must be an integer tensor")
    return array


def _axis(op: str, x: TensorLike, axis: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise KernelError(op, (x,), f"axis must be an int, not {axis!r}")
    if not shape_of(x):
        raise KernelError(op, (x,), "cannot gather from a 0-d tensor")
    return normalize_axes(op, x, int(axis))[0]


# ---------------------------------------------------------------- take


def _take_shape(x: Any, indices: NDArray[Any], axis: int) -> tuple[Shape, Any]:
    shape = shape_of(x)
    return shape[:axis] + tuple(indices.shape) + shape[axis + 1:], dtype_of(x)


take_p = declare("take", lambda backend, x, indices, axis:
                 gather_ops(backend).take(x, indices, axis), _take_shape, aliasing="fresh")


def _take_scatter_shape(values: Any, indices: NDArray[Any], axis: int,
                        size: int) -> tuple[Shape, Any]:
    shape, picked = shape_of(values), tuple(indices.shape)
    if shape[axis:axis + len(picked)] != picked:
        raise KernelError("take", (values, indices), f"values must have the indices' shape "
                          f"{picked} from axis {axis}")
    return shape[:axis] + (size,) + shape[axis + len(picked):], dtype_of(values)


take_scatter_add_p = declare(
    "take_scatter_add",
    lambda backend, values, indices, axis, size:
        gather_ops(backend).take_scatter_add(values, indices, axis, size),
    _take_scatter_shape, aliasing="fresh")

deflinear(take_p, lambda ct, x, indices, axis: (
    take_scatter_add_p.bind(ct, indices=indices, axis=axis, size=shape_of(x)[axis]),))
deflinear(take_scatter_add_p, lambda ct, values, indices, axis, size: (
    take_p.bind(ct, indices=indices, axis=axis),))


def take(x: TensorLike, indices: TensorLike, axis: int = 0) -> Tensor:
    """The slices of x along `axis` at integer `indices` (negative ones count from the
    end), as np.take(x, indices, axis) and torch.index_select (with indices of any
    shape): shape x.shape[:axis] + indices.shape + x.shape[axis + 1:]. Differentiable
    in x; the indices get no gradient. Indices out of range are a KernelError."""
    array = _indices("take", x, indices)
    return take_p.bind(x, indices=array, axis=_axis("take", x, axis))


def take_scatter_add(values: TensorLike, indices: TensorLike, axis: int, size: int) -> Tensor:
    """The transpose of take: zeros with `size` along `axis`, each slice of values added
    at its index (repeated indices accumulate)."""
    array = _indices("take", values, indices)
    _take_scatter_shape(values, array, axis, size)  # eager calls skip shape rules
    return take_scatter_add_p.bind(values, indices=array, axis=axis, size=size)


# ---------------------------------------------------------------- take_along_axis


def _along_shape(op: str, x: Any, indices: NDArray[Any], axis: int) -> Shape:
    """x's shape and the indices' broadcast on every axis but `axis`, where the indices'
    length stays; a KernelError unless they have one rank and broadcast."""
    shape, picked = shape_of(x), tuple(indices.shape)
    if len(picked) != len(shape):
        raise KernelError(op, (x, indices), f"indices must have x's {len(shape)} dimensions")
    out = []
    for d, (a, b) in enumerate(zip(shape, picked)):
        if d == axis:
            out.append(b)
        elif a != b and 1 not in (a, b):
            raise KernelError(op, (x, indices), f"sizes {a} and {b} on axis {d} do not "
                              "broadcast")
        else:
            out.append(b if a == 1 else a)
    return tuple(out)


def _along_axis_shape(x: Any, indices: NDArray[Any], axis: int) -> tuple[Shape, Any]:
    return _along_shape("take_along_axis", x, indices, axis), dtype_of(x)


take_along_axis_p = declare(
    "take_along_axis",
    lambda backend, x, indices, axis: gather_ops(backend).take_along_axis(x, indices, axis),
    _along_axis_shape, aliasing="fresh")


def _along_scatter_shape(values: Any, indices: NDArray[Any], axis: int,
                         size: int) -> tuple[Shape, Any]:
    shape = shape_of(values)
    if _along_shape("take_along_axis", values, indices, axis) != shape:
        raise KernelError("take_along_axis", (values, indices), "the indices must broadcast "
                          "to the values' shape")
    return shape[:axis] + (size,) + shape[axis + 1:], dtype_of(values)


take_along_axis_scatter_add_p = declare(
    "take_along_axis_scatter_add",
    lambda backend, values, indices, axis, size:
        gather_ops(backend).take_along_axis_scatter_add(values, indices, axis, size),
    _along_scatter_shape, aliasing="fresh")


def _along_transpose(ct: Any, x: Any, indices: NDArray[Any], axis: int) -> tuple[Any]:
    # Scattered into the broadcast shape, then summed over the axes x was broadcast on.
    spread = take_along_axis_scatter_add_p.bind(ct, indices=indices, axis=axis,
                                                size=shape_of(x)[axis])
    return (sum_to_shape(spread, shape_of(x)),)


deflinear(take_along_axis_p, _along_transpose)
deflinear(take_along_axis_scatter_add_p, lambda ct, values, indices, axis, size: (
    take_along_axis_p.bind(ct, indices=indices, axis=axis),))


def take_along_axis(x: TensorLike, indices: TensorLike, axis: int) -> Tensor:
    """x[..., indices[..., j, ...], ...] along `axis`, as np.take_along_axis and
    torch.take_along_dim (torch.gather where the shapes agree): indices have x's rank
    and broadcast with x on the other axes. Differentiable in x; the indices get no
    gradient. Indices out of range are a KernelError."""
    array = _indices("take_along_axis", x, indices)
    axis = _axis("take_along_axis", x, axis)
    _along_shape("take_along_axis", x, array, axis)  # eager calls skip shape rules
    return take_along_axis_p.bind(x, indices=array, axis=axis)


def take_along_axis_scatter_add(values: TensorLike, indices: TensorLike, axis: int,
                                size: int) -> Tensor:
    """The transpose of take_along_axis: zeros of values' shape with `size` along
    `axis`, each value added at its index (repeated indices accumulate)."""
    array = _indices("take_along_axis", values, indices)
    _along_scatter_shape(values, array, axis, size)  # eager calls skip shape rules
    return take_along_axis_scatter_add_p.bind(values, indices=array, axis=axis, size=size)


# ---------------------------------------------------------------- samples for `pullback check`

# Repeated and negative indices: the scatter-adds must accumulate and wrap.
_ROWS = np.array([[0, 2], [2, -1], [3, 0]])
_ALONG = np.array([[1, 1, -4], [0, 3, 2]])
_BROADCAST = np.array([[3], [-1], [0]])  # one index per row of a (1, 4) x: x broadcasts

declare_check(take_p, lambda x: (take(x, _ROWS), take(x, _ROWS[0], axis=1), take(x, -1)),
              inputs(normal(4, 4)))
declare_check(take_scatter_add_p, lambda v: take_scatter_add(v, _ROWS, 1, 5),
              inputs(normal(2, 3, 2)))
declare_check(take_along_axis_p, lambda x: (take_along_axis(x, _ALONG, 1),
                                            take_along_axis(x, _ALONG[:, :1], 1),
                                            take_along_axis(x[:1], _BROADCAST, 1)),
              inputs(normal(2, 4)))
declare_check(take_along_axis_scatter_add_p,
              lambda v: take_along_axis_scatter_add(v, _ALONG, 1, 4), inputs(normal(2, 3)))
