"""Declaring primitives: the registry and the shape-rule helpers every op file uses.

`declare` makes a primitive with its forward (a backend call) and shape rule;
the op's file then adds its derivative rules and the facts other layers need
(fusion template, buffer writers, Tensor method) right beside it. `PRIMITIVES`
lists every primitive the ops layer declares, for `pullback check`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

import numpy as np

from ..ad import Primitive
from ..errors import KernelError
from .hints import Axis, Shape

#: Every primitive pullback declares, by its public name.
PRIMITIVES: dict[str, Primitive] = {}

FLOAT_DTYPES = ("float32", "float64")
ALIASING = ("fresh", "view", "may")
_FUSION_FUNCTIONS: dict[str, Callable[..., Any]] = {}  # every name a fusion template calls


class Fusion(NamedTuple):
    """How a plan fuses a primitive into a generated elementwise kernel: `template`,
    scalar code over its operands `{0}`, `{1}`, ... in the terms NumPy's float loops
    use, and `scope`, the scalar functions that code calls by name (from
    kernels.scalar_math: within an ulp or two of NumPy's)."""

    template: str
    scope: Mapping[str, Callable[..., Any]] | None = None


class CotangentInto(NamedTuple):
    """How a plan's backward step writes a primitive's first-operand cotangent into a
    buffer it keeps across calls, computing what the primitive's vjp computes.

    `order(args, first, by_columns, first_by_columns)`: the buffer's memory order ("C"
    or "F"), or None where it cannot write one; `args` are the forward operands and
    `first` the first one (shape and dtype each), `by_columns` whether the forward
    result is laid out by columns, `first_by_columns` whether the first operand is.
    `write(backend, upstream, node, out)`: one cotangent (or None) per operand, the
    first written into `out` through the backend's `out=` forms."""

    order: Callable[[tuple[Any, ...], Any, bool, bool], str | None]
    write: Callable[..., tuple[Any, ...]]


def declare(
    name: str,
    impl: Callable[..., Any],
    shape_rule: Callable[..., tuple[Any, ...]],
    *,
    saves_inputs: bool = False,
    saves_output: bool = False,
    differentiable: bool = True,
    register: bool = True,
    fusion: Fusion | None = None,
    aliasing: str = "may",
) -> Primitive:
    """A new primitive: `impl(backend, *arrays, **params)` computes it forward.

    `fusion`: its scalar code for a plan's fused elementwise kernels (None: never
    fused); `aliasing`: "fresh" when its result never shares memory with an operand,
    "view" when it is a view of its first operand, "may" (the safe default) else."""
    if aliasing not in ALIASING:
        raise ValueError(f"{name}: aliasing must be one of {ALIASING}, not {aliasing!r}")
    if fusion is not None:
        if not isinstance(fusion, Fusion):
            raise TypeError(f"{name}: fusion must be a Fusion, not {type(fusion).__name__}")
        for called, fn in (fusion.scope or {}).items():
            # Fused chains share one scope: a name must stand for one function.
            if _FUSION_FUNCTIONS.setdefault(called, fn) is not fn:
                raise ValueError(f"{name}: the fusion name {called!r} already stands for "
                                 "another function")
    prim = Primitive(
        name, saves_inputs=saves_inputs, saves_output=saves_output, differentiable=differentiable
    )
    prim.impl = impl
    prim.abstract_eval = shape_rule
    prim.fusion = fusion
    prim.aliasing = aliasing
    if register:
        if name in PRIMITIVES:
            raise ValueError(f"a primitive named {name!r} is already declared")
        PRIMITIVES[name] = prim
    return prim


def writes_into(prim: Primitive, rule: Callable[..., Any],
                layout: Callable[..., str] | None = None) -> None:
    """Declare how `prim` writes its result into a given buffer: `rule(backend, *args,
    out, **params)` through the backend's `out=` form of the op; `layout(*args)` the
    memory order its result comes in ("C" when omitted)."""
    prim.into = rule
    prim.layout = layout


def writes_cotangent_into(prim: Primitive,
                          order: Callable[[tuple[Any, ...], Any, bool, bool], str | None],
                          write: Callable[..., tuple[Any, ...]]) -> None:
    """Declare how a plan writes `prim`'s first-operand cotangent into a buffer (see
    `CotangentInto`)."""
    prim.ct_into = CotangentInto(order, write)


_Function = TypeVar("_Function", bound=Callable[..., Any])


def tensor_method(prim: Primitive) -> Callable[[_Function], _Function]:
    """Make the decorated function `Tensor.<its name>` as well (the function itself is
    returned unchanged)."""

    def register(fn: _Function) -> _Function:
        prim.method = fn
        return fn

    return register


def shape_of(x: object) -> Shape:
    return tuple(x.shape) if hasattr(x, "shape") else ()


def dtype_of(x: object) -> Any:
    """The dtype of an array operand; None for a scalar, a NumPy scalar included (it acts
    as the Python scalar it equals, taking the arrays' dtype)."""
    if isinstance(x, np.generic):
        return None
    return getattr(x, "dtype", None)


def is_float(dtype: object) -> bool:
    return str(dtype) in FLOAT_DTYPES


def broadcast_shapes(op: str, *operands: Any) -> Shape:
    """NumPy's broadcast of the operands' shapes, or a KernelError naming them."""
    shapes = [shape_of(x) for x in operands]
    ndim = max(len(s) for s in shapes)
    result = []
    for axis in range(ndim):
        size = 1
        for s in shapes:
            dim = s[axis - ndim + len(s)] if axis - ndim + len(s) >= 0 else 1
            if dim != 1:
                if size not in (1, dim):
                    raise KernelError(op, operands, "shapes cannot be broadcast together")
                size = dim
        result.append(size)
    return tuple(result)


def result_dtype(op: str, *operands: Any) -> Any:
    """The dtype of an elementwise result: that of the array operands, which must agree
    when they are floating; Python scalars take the arrays' dtype."""
    dtypes = [dtype_of(x) for x in operands if dtype_of(x) is not None]
    floats = {str(d) for d in dtypes if is_float(d)}
    if len(floats) > 1:
        raise KernelError(
            op, operands, "operands have different floating dtypes; cast one with astype"
        )
    for d in dtypes:
        if is_float(d):
            return d
    return dtypes[0] if dtypes else None


def elementwise_rule(op: str) -> Callable[..., tuple[Shape, Any]]:
    def rule(*operands: Any, **params: Any) -> tuple[Shape, Any]:
        return broadcast_shapes(op, *operands), result_dtype(op, *operands)

    return rule


def normalize_axes(op: str, x: object, axis: Axis) -> tuple[int, ...]:
    """Sorted non-negative axes from None, an int or a sequence; KernelError if out of range."""
    ndim = len(shape_of(x))
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    normalized = []
    for a in axes:
        if not isinstance(a, int) or not -max(ndim, 1) <= a < max(ndim, 1):
            raise KernelError(op, (x,), f"axis {a} is out of range for {ndim} dimensions")
        if ndim:  # a 0-d tensor's axis 0 (or -1), as PyTorch allows, reduces over nothing
            normalized.append(a % ndim)
    if len(set(normalized)) != len(normalized):
        raise KernelError(op, (x,), f"axis {axis} repeats an axis")
    return tuple(sorted(normalized))


def reduced_shape(shape: Shape, axes: tuple[int, ...], keepdims: bool) -> Shape:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)
