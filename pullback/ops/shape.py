"""Shape primitives: all linear, each with its transpose beside it.

broadcast_to and sum_to_shape are each other's transpose, as are getitem and
scatter_add, and pad2d and its crop; a gradient that must be reduced back to
a broadcast operand's shape always goes through `sum_to_shape`.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from types import EllipsisType
from typing import TYPE_CHECKING, Any, TypeGuard, Union

import numpy as np

from ..ad import ALL_ARGS, LinearVar, Zero, add_tangents, defjvp, defjvp_full, deflinear, defvjp
from ..errors import KernelError, index_error
from .checks import declare_check, inputs, normal
from .hints import ArrayLike, Shape, TensorLike
from .registry import broadcast_shapes, declare, dtype_of, shape_of

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["broadcast_to", "concatenate", "reshape", "stack", "transpose"]

# One entry of an index, as NumPy takes it: an int, a slice, `...`, None (a new axis), or
# an integer or bool array (a tensor, an array, a list) picking elements.
IndexItem = Union[int, slice, EllipsisType, None, "Tensor", ArrayLike]
# What `x[index]` (`getitem`) takes: one entry or a tuple of them.
Index = IndexItem | tuple[IndexItem, ...]

# The values an op is handed that are not tensors (nor tracers or linear variables, which
# act as tensors inside transforms and plans).
_PLAIN = (np.ndarray, np.generic, list, tuple, int, float, complex)


def is_tensor(x: object) -> TypeGuard[Tensor]:
    """Whether x is a tensor, or a value acting as one inside a transform or a plan,
    rather than a plain array, list or number. An op that would change nothing gives a
    tensor back itself; a plain operand still goes through the primitive, so that the
    result is what the evaluator makes of it (a tensor, eagerly), as for any other call."""
    return not isinstance(x, _PLAIN)

# ---------------------------------------------------------------- reshape / transpose


def _reshape_shape(x: Any, shape: Shape) -> tuple[Shape, Any]:
    size = 1
    for d in shape_of(x):
        size *= d
    target = 1
    for d in shape:
        target *= d
    if size != target or any(d < 0 for d in shape):
        raise KernelError("reshape", (x,), f"cannot reshape {size} elements into {shape}")
    return shape, dtype_of(x)


reshape_p = declare("reshape", lambda backend, x, shape: backend.reshape(x, shape), _reshape_shape,
                    aliasing="view")
deflinear(reshape_p, lambda ct, x, shape: (reshape(ct, x.shape),))
# Eager backward and plans: the backend's reshape, without re-entering bind.
defvjp(reshape_p, lambda be, g, n: (be.reshape(g, n.in_shapes[0]),))


def reshape(x: TensorLike, *shape: int | Sequence[int]) -> Tensor:
    """Reshape to `shape` (a tuple or separate ints; one entry may be -1)."""
    given: Sequence[Any] = shape
    if len(shape) == 1 and hasattr(shape[0], "__len__"):  # one sequence of dims
        given = tuple(shape[0])  # type: ignore[arg-type]  # a sized sequence, as checked
    try:
        dims = tuple(operator.index(d) for d in given)
    except TypeError:
        raise KernelError("reshape", (x,), f"the shape must be ints, got {given}") from None
    if -1 in dims:
        known = 1
        for d in dims:
            if d != -1:
                known *= d
        size = 1
        for d in shape_of(x):
            size *= d
        if dims.count(-1) > 1 or known == 0 or size % known:
            raise KernelError("reshape", (x,), f"cannot reshape {size} elements into {dims}")
        dims = tuple(size // known if d == -1 else d for d in dims)
    if dims == shape_of(x) and is_tensor(x):
        return x
    return reshape_p.bind(x, shape=dims)


def _transpose_shape(x: Any, axes: Shape) -> tuple[Shape, Any]:
    shape = shape_of(x)
    if sorted(axes) != list(range(len(shape))):
        raise KernelError(
            "transpose", (x,), f"axes {axes} are not a permutation of {len(shape)} axes"
        )
    return tuple(shape[a] for a in axes), dtype_of(x)


transpose_p = declare("transpose", lambda backend, x, axes: backend.transpose(x, axes),
                      _transpose_shape, aliasing="view")


def _inverse(axes: Sequence[int]) -> Shape:
    inverse = [0] * len(axes)
    for i, a in enumerate(axes):
        inverse[a] = i
    return tuple(inverse)


deflinear(transpose_p, lambda ct, x, axes: (transpose_p.bind(ct, axes=_inverse(axes)),))
defvjp(transpose_p, lambda be, g, n: (be.transpose(g, _inverse(n.params["axes"])),))


def transpose(x: TensorLike, axes: Sequence[int] | None = None) -> Tensor:
    """Permute axes; with no `axes`, reverse them (as NumPy)."""
    ndim = len(shape_of(x))
    if axes is None:
        order = tuple(reversed(range(ndim)))
    else:
        order = tuple(a % ndim if isinstance(a, int) and -ndim <= a < ndim else a for a in axes)
    if order == tuple(range(ndim)) and is_tensor(x):
        return x
    return transpose_p.bind(x, axes=order)


def swap_last(x: TensorLike) -> Tensor:
    """Swap the last two axes (a matrix transpose over any batch)."""
    ndim = len(shape_of(x))
    return transpose(x, tuple(range(ndim - 2)) + (ndim - 1, ndim - 2))


# ---------------------------------------------------------------- broadcasting


def _broadcast_shape(x: Any, shape: Shape) -> tuple[Shape, Any]:
    target = _Shape(shape)
    if broadcast_shapes("broadcast_to", x, target) != shape:
        raise KernelError("broadcast_to", (x, target), "cannot broadcast to the second shape")
    return shape, dtype_of(x)


class _Shape:
    """A bare shape standing in for an operand in shape rules and error messages."""

    def __init__(self, shape: Sequence[int]):
        self.shape = tuple(shape)
        self.dtype = "shape"


broadcast_to_p = declare("broadcast_to", lambda backend, x, shape: backend.broadcast_to(x, shape),
                         _broadcast_shape)
deflinear(broadcast_to_p, lambda ct, x, shape: (sum_to_shape(ct, x.shape),))


def broadcast_to(x: TensorLike, shape: Sequence[int]) -> Tensor:
    """x repeated along new leading axes and its size-1 axes to `shape`, as
    np.broadcast_to; its gradient is summed back (`sum_to_shape`)."""
    target = tuple(shape)
    if type(x) is Zero:  # a symbolic zero tangent stays one (forward mode)
        return Zero(target, x.dtype)  # type: ignore[return-value]  # acts as a tensor
    if shape_of(x) == target and is_tensor(x):
        return x
    return broadcast_to_p.bind(x, shape=target)


def _sum_to_shape_rule(x: Any, shape: Shape) -> tuple[Shape, Any]:
    if broadcast_shapes("sum_to_shape", x, _Shape(shape)) != shape_of(x):
        raise KernelError(
            "sum_to_shape", (x, _Shape(shape)), "the first does not broadcast from the second"
        )
    return shape, dtype_of(x)


sum_to_shape_p = declare("sum_to_shape", lambda backend, x, shape: backend.sum_to_shape(x, shape),
                         _sum_to_shape_rule)
deflinear(sum_to_shape_p, lambda ct, x, shape: (broadcast_to(ct, x.shape),))


def sum_to_shape(x: TensorLike, shape: Sequence[int]) -> Tensor:
    """Sum a broadcast value back to `shape`: the transpose of broadcast_to."""
    target = tuple(shape)
    if shape_of(x) == target and is_tensor(x):
        return x
    return sum_to_shape_p.bind(x, shape=target)


# ---------------------------------------------------------------- indexing


def normalize_index(index: Index) -> Any:
    """Tensors in an index become arrays (indices are never differentiated). The result
    goes to NumPy's indexing (or a backend's), which judges it: typed Any, as it holds
    whatever the caller's index held."""
    if isinstance(index, tuple):
        return tuple(getattr(i, "_data", i) for i in index)
    return getattr(index, "_data", index)


def _index_shape(x: Any, index: Any) -> tuple[Shape, Any]:
    import numpy as np  # shape arithmetic only: NumPy's indexing rules are the spec

    try:
        probe = np.broadcast_to(np.empty((), dtype=np.int8), shape_of(x))[index]
    except (IndexError, ValueError, TypeError) as err:
        raise index_error("getitem", (x,), f"invalid index {index!r}: {err}", err) from None
    return tuple(probe.shape), dtype_of(x)


getitem_p = declare("getitem", lambda backend, x, index: backend.getitem(x, index), _index_shape)
deflinear(getitem_p, lambda ct, x, index: (scatter_add(ct, index, x.shape),))


def getitem(x: TensorLike, index: Index) -> Tensor:
    """`x[index]`, with NumPy's indexing rules (basic and advanced); differentiable in x,
    its transpose `scatter_add`."""
    return getitem_p.bind(x, index=normalize_index(index))


def _scatter_shape(values: Any, index: Any, shape: Shape) -> tuple[Shape, Any]:
    expected, _ = _index_shape(_Shape(shape), index)
    if broadcast_shapes("scatter_add", values, _Shape(expected)) != expected:
        raise KernelError("scatter_add", (values, _Shape(expected)), "values do not fit the index")
    return tuple(shape), dtype_of(values)


scatter_add_p = declare(
    "scatter_add",
    lambda backend, values, index, shape: backend.scatter_add(values, index, shape),
    _scatter_shape,
    aliasing="fresh",
)
deflinear(scatter_add_p, lambda ct, values, index, shape: (
    sum_to_shape(getitem_p.bind(ct, index=index), values.shape),))


def scatter_add(values: TensorLike, index: Index, shape: Sequence[int]) -> Tensor:
    """Zeros of `shape` with `values` added at `index`: the transpose of getitem."""
    return scatter_add_p.bind(values, index=normalize_index(index), shape=tuple(shape))


# ---------------------------------------------------------------- joining


def _concat_shape(*xs: Any, axis: int) -> tuple[Shape, Any]:
    shapes = [shape_of(x) for x in xs]
    first = shapes[0]
    for s in shapes[1:]:
        if len(s) != len(first) or any(
            a != b for i, (a, b) in enumerate(zip(s, first)) if i != axis
        ):
            raise KernelError("concatenate", xs, f"shapes differ outside axis {axis}")
    dtypes = {str(dtype_of(x)) for x in xs}
    if len(dtypes) > 1:
        raise KernelError("concatenate", xs, "operands have different dtypes")
    size = sum(s[axis] for s in shapes)
    return first[:axis] + (size,) + first[axis + 1 :], dtype_of(xs[0])


def _concat_impl(backend: Any, *xs: Any, axis: int) -> Any:
    dtype = xs[0].dtype
    if any(x.dtype != dtype for x in xs[1:]):
        raise KernelError("concatenate", xs, "operands have different dtypes; cast with astype")
    return backend.concatenate(xs, axis)


concatenate_p = declare("concatenate", _concat_impl, _concat_shape, aliasing="fresh")


def _concat_jvp(tangents: tuple[Any, ...], output: Any, inputs: tuple[Any, ...],
                axis: int) -> Any:
    if not any(type(t) is Zero for t in tangents):
        return concatenate_p.bind(*tangents, axis=axis)
    # Place each nonzero tangent in its slice of the output: no zeros are built.
    out_shape = list(tangents[0].shape)
    out_shape[axis] = sum(t.shape[axis] for t in tangents)
    result: Any = None
    start = 0
    for t in tangents:
        stop = start + t.shape[axis]
        if type(t) is not Zero:
            index = (slice(None),) * axis + (slice(start, stop),)
            part = scatter_add_p.bind(t, index=index, shape=tuple(out_shape))
            result = part if result is None else add_tangents(result, part)
        start = stop
    return result


def _concat_transpose(ct: Any, *xs: Any, axis: int) -> tuple[Any, ...]:
    cts = []
    start = 0
    for x in xs:
        stop = start + shape_of(x)[axis]
        if type(x) is LinearVar:
            index = (slice(None),) * axis + (slice(start, stop),)
            cts.append(getitem_p.bind(ct, index=index))
        else:
            cts.append(None)
        start = stop
    return tuple(cts)


defjvp_full(concatenate_p, _concat_jvp)
deflinear(concatenate_p, _concat_transpose, linear_args=ALL_ARGS)


def concatenate(xs: Iterable[TensorLike], axis: int = 0) -> Tensor:
    """The operands joined along `axis`, an existing axis (as np.concatenate); their
    shapes agree elsewhere, and their dtypes too."""
    operands = tuple(xs)
    if not operands:
        raise KernelError("concatenate", (), "needs at least one operand")
    ndim = len(shape_of(operands[0]))
    if not -ndim <= axis < ndim:
        raise KernelError("concatenate", operands,
                          f"axis {axis} is out of range for {ndim} dimensions")
    if len(operands) == 1 and is_tensor(operands[0]):
        return operands[0]
    return concatenate_p.bind(*operands, axis=axis % ndim)


def stack(xs: Iterable[TensorLike], axis: int = 0) -> Tensor:
    """The operands, of one shape and dtype, joined along a new axis `axis` (as
    np.stack)."""
    operands = tuple(xs)
    if not operands:
        raise KernelError("stack", (), "needs at least one operand")
    shape = shape_of(operands[0])
    if any(shape_of(x) != shape for x in operands):
        raise KernelError("stack", operands, "all operands must have the same shape")
    if len({str(dtype_of(x)) for x in operands}) > 1:
        raise KernelError("stack", operands, "operands have different dtypes; cast with astype")
    if not -len(shape) - 1 <= axis <= len(shape):
        raise KernelError(
            "stack", operands, f"axis {axis} is out of range for {len(shape) + 1} dimensions"
        )
    axis %= len(shape) + 1
    expanded = shape[:axis] + (1,) + shape[axis:]
    return concatenate_p.bind(*(reshape_p.bind(x, shape=expanded) for x in operands), axis=axis) \
        if len(operands) > 1 else reshape_p.bind(operands[0], shape=expanded)


# ---------------------------------------------------------------- padding


def _pad_shape(x: Any, padding: tuple[int, int], value: float) -> tuple[Shape, Any]:
    shape = shape_of(x)
    if len(shape) < 2:
        raise KernelError("pad2d", (x,), "needs at least two dimensions")
    ph, pw = padding
    return shape[:-2] + (shape[-2] + 2 * ph, shape[-1] + 2 * pw), dtype_of(x)


pad2d_p = declare("pad2d", lambda backend, x, padding, value: backend.pad2d(x, padding, value),
                  _pad_shape, aliasing="fresh")


def _pad_transpose(ct: Any, x: Any, padding: tuple[int, int], value: float) -> tuple[Any]:
    ph, pw = padding
    h, w = shape_of(x)[-2:]
    return (getitem_p.bind(ct, index=(Ellipsis, slice(ph, ph + h), slice(pw, pw + w))),)


# Affine in x when value != 0; its tangent is always padded with zeros.
deflinear(pad2d_p, _pad_transpose)
defjvp(pad2d_p, lambda t, out, x, padding, value: pad2d_p.bind(t, padding=padding, value=0.0))


def pad2d(x: TensorLike, padding: Sequence[int], value: float = 0.0) -> Tensor:
    """x with `padding` = (rows, columns) of `value` added on each side of its last two
    dimensions."""
    return pad2d_p.bind(x, padding=tuple(padding), value=value)


# ---------------------------------------------------------------- identity (for transforms)


identity_p = declare("identity", lambda backend, x: x, lambda x: (shape_of(x), dtype_of(x)),
                     register=False)
deflinear(identity_p, lambda ct, x: (ct,))


def identity(x: TensorLike) -> Tensor:
    """x itself, as a new recorded node: marks where a nested transform's input begins."""
    return identity_p.bind(x)


stop_gradient_p = declare("stop_gradient", lambda backend, x: x,
                          lambda x: (shape_of(x), dtype_of(x)), differentiable=False,
                          register=False)


# ---------------------------------------------------------------- samples for `pullback check`

_INDEX = (np.array([0, 2, 2]), slice(1, 4))  # a repeated row: scatter_add must accumulate

declare_check(reshape_p, lambda x: reshape(x, (6, 4)), inputs(normal(2, 3, 4)))
declare_check(transpose_p, lambda x: transpose(x, (2, 0, 1)), inputs(normal(2, 3, 4)))
declare_check(broadcast_to_p, lambda x: broadcast_to(x, (2, 3, 4)), inputs(normal(3, 1)))
declare_check(sum_to_shape_p, lambda x: sum_to_shape(x, (3, 1)), inputs(normal(2, 3, 4)))
declare_check(getitem_p, lambda x: (getitem(x, 1), getitem(x, _INDEX),
                                    getitem(x, (Ellipsis, slice(None, None, 2)))),
              inputs(normal(4, 5)))
declare_check(scatter_add_p, lambda v: scatter_add(v, _INDEX, (4, 5)), inputs(normal(3, 3)))
declare_check(concatenate_p, lambda a, b, c: concatenate((a, b, c), axis=1),
              inputs(normal(2, 3), normal(2, 1), normal(2, 2)))
declare_check(pad2d_p, lambda x: pad2d(x, (1, 2)), inputs(normal(1, 2, 3, 3)))
