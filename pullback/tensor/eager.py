"""`Tensor` and the eager evaluator that records the graph as ops run.

`evaluate` is what every primitive's `bind` calls for concrete operands: it
runs the primitive's forward on the current backend and, when an operand is
active and recording is on, records a node holding exactly what the
primitive's rules need. Per-op Python overhead is a product metric: keep this
path short.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from .. import ops
from ..ad import Leaf, LinearVar, set_evaluator
from ..backend.current import _current, get_backend
from ..backend.errors import KernelError
from .protect import TensorNode, protect, saved_by, writeable_if_free
from .state import GRAD_ENABLED

_new = object.__new__


def _wrap(data: Any, node: Any) -> Tensor:
    t = _new(Tensor)
    t._data = data
    t._node = node
    t.grad = None
    return t


def evaluate(prim: Any, args: tuple, params: dict) -> Tensor:
    """Run `prim` on concrete operands (tensors, arrays, scalars); record if active."""
    backend = _current[-1] if _current else get_backend()
    active = False
    if len(args) == 1:  # the common cases, without building lists
        a = args[0]
        if type(a) is Tensor:
            arrays = (a._data,)
            parents = (a._node,)
            active = a._node is not None
        else:
            arrays, parents = args, (None,)
    elif len(args) == 2:
        a, b = args
        if type(a) is Tensor:
            x, pa = a._data, a._node
        else:
            x, pa = a, None
        if type(b) is Tensor:
            y, pb_ = b._data, b._node
        else:
            y, pb_ = b, None
        arrays, parents = (x, y), (pa, pb_)
        active = pa is not None or pb_ is not None
    else:
        arrays = tuple([a._data if type(a) is Tensor else a for a in args])
        parents = tuple([a._node if type(a) is Tensor else None for a in args])
        active = any(p is not None for p in parents)
    out = prim.impl(backend, *arrays, **params)
    if not active or not GRAD_ENABLED[0] or not prim.differentiable or out.dtype.kind != "f":
        return _wrap(out, None)  # integer and bool results carry no gradient
    node = TensorNode(
        prim,
        params,
        parents,
        arrays if prim.saves_inputs else None,
        out if prim.saves_output else None,
        tuple([x.shape if type(x) is np.ndarray else () for x in arrays]),
        out.shape,
        out.dtype,
    )
    if prim.saves_inputs:
        for x in arrays:
            if type(x) is np.ndarray and x.dtype is not out.dtype and x.dtype.kind in "iub":
                node.inputs = _saved_as_float(arrays, out.dtype)
                break
        for x in node.inputs:
            if type(x) is np.ndarray:
                protect(x, prim.name)
    if prim.saves_output:
        protect(out, prim.name)
    return _wrap(out, node)


def _saved_as_float(arrays: tuple, dtype: np.dtype) -> tuple:
    """Integer operands saved as the result's float dtype, so that backward kernels
    (g * other) give gradients in their input's dtype."""
    return tuple(
        x.astype(dtype) if type(x) is np.ndarray and x.dtype.kind in "iub" else x for x in arrays
    )


set_evaluator(evaluate)


class _Operators:
    """Operators and methods shared by `Tensor` and the linear variables of transforms."""

    __slots__ = ()
    __array_priority__ = 1000  # ndarray (op) Tensor defers to us

    def __add__(self, other: Any) -> Any:
        return ops.add(self, other)

    def __radd__(self, other: Any) -> Any:
        return ops.add(other, self)

    def __sub__(self, other: Any) -> Any:
        return ops.sub(self, other)

    def __rsub__(self, other: Any) -> Any:
        return ops.sub(other, self)

    def __mul__(self, other: Any) -> Any:
        return ops.mul(self, other)

    def __rmul__(self, other: Any) -> Any:
        return ops.mul(other, self)

    def __truediv__(self, other: Any) -> Any:
        return ops.div(self, other)

    def __rtruediv__(self, other: Any) -> Any:
        return ops.div(other, self)

    def __pow__(self, other: Any) -> Any:
        return ops.pow(self, other)

    def __rpow__(self, other: Any) -> Any:
        return ops.pow(other, self)

    def __matmul__(self, other: Any) -> Any:
        return ops.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return ops.matmul(other, self)

    def __neg__(self) -> Any:
        return ops.neg(self)

    def __pos__(self) -> Any:
        return self

    def __getitem__(self, index: Any) -> Any:
        return ops.getitem(self, index)

    @property
    def T(self) -> Any:
        return ops.transpose(self)

    def sum(self, axis: Any = None, keepdims: bool = False) -> Any:
        return ops.sum(self, axis, keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> Any:
        return ops.mean(self, axis, keepdims)

    def reshape(self, *shape: Any) -> Any:
        return ops.reshape(self, *shape)

    def transpose(self, axes: Any = None) -> Any:
        return ops.transpose(self, axes)

    def broadcast_to(self, shape: Any) -> Any:
        return ops.broadcast_to(self, shape)

    def astype(self, dtype: Any) -> Any:
        return ops.astype(self, np.dtype(dtype))

    def matmul(self, other: Any) -> Any:
        return ops.matmul(self, other)


for _name in ("neg", "exp", "log", "sqrt", "abs", "relu", "sigmoid", "tanh", "silu", "softplus",
              "gelu", "softmax", "log_softmax", "max", "clip", "maximum", "minimum"):
    setattr(_Operators, _name, getattr(ops, _name))

# A linear variable behaves like a tensor inside `linear_transpose`'s function.
for _name, _value in vars(_Operators).items():
    if _name not in ("__slots__", "__doc__", "__module__", "__dict__", "__qualname__"):
        setattr(LinearVar, _name, _value)


class Tensor(_Operators):
    """An n-dimensional array that can record the ops applied to it.

    Build one with `pullback.tensor`. A tensor that requires grad is a leaf
    (its `.grad` collects gradients) or the output of recorded ops.
    """

    __slots__ = ("__weakref__", "_data", "_node", "grad")

    def __init__(self, data: Any, dtype: Any = None, requires_grad: bool = False):
        from .creation import as_array

        self._data = as_array(data, dtype)
        self._node = None
        self.grad = None
        if requires_grad:
            self.requires_grad = True

    # ------------------------------------------------------------ attributes

    @property
    def shape(self) -> tuple:
        return self._data.shape

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return self._data.size

    def __len__(self) -> int:
        if not self._data.ndim:
            raise TypeError("len() of a 0-d tensor")
        return len(self._data)

    @property
    def requires_grad(self) -> bool:
        return self._node is not None

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if value:
            if self._node is not None:
                return
            if self._data.dtype.kind != "f":
                raise TypeError(
                    f"requires_grad: only floating tensors can require grad; this one is "
                    f"{self._data.dtype} with shape {self.shape}"
                )
            self._node = Leaf(self.shape, self.dtype, weakref.ref(self))
        else:
            if self._node is not None and self._node.primitive is not None:
                raise ValueError(
                    "requires_grad: only a leaf can stop requiring grad; use .detach() "
                    "for a tensor computed from others"
                )
            self._node = None

    def requires_grad_(self, value: bool = True) -> Tensor:
        self.requires_grad = value
        return self

    @property
    def is_leaf(self) -> bool:
        return self._node is None or self._node.primitive is None

    # ------------------------------------------------------------ conversions

    def numpy(self) -> np.ndarray:
        """The data as a NumPy array, sharing memory with the tensor (read-only while
        a pending backward needs it)."""
        data = self._data
        if not data.flags.writeable:
            writeable_if_free(data)
        return data

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if dtype is not None and dtype != self._data.dtype:
            return self._data.astype(dtype)
        return self._data.copy() if copy else self._data

    def item(self) -> Any:
        if self._data.size != 1:
            raise ValueError(f"item: only a one-element tensor has an item; shape is {self.shape}")
        return self._data.item()

    def tolist(self) -> Any:
        return self._data.tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        if self._data.size != 1:
            raise ValueError(
                f"the truth value of a tensor with {self._data.size} elements is ambiguous"
            )
        return bool(self._data)

    def detach(self) -> Tensor:
        """The same data, cut from the graph."""
        return _wrap(self._data, None)

    def clone(self) -> Tensor:
        return ops.mul(self, 1) if self._node is not None else _wrap(self._data.copy(), None)

    def __repr__(self) -> str:
        body = np.array2string(self._data, separator=", ", prefix="tensor(")
        extra = f", dtype={self.dtype}" if self.dtype != np.float32 else ""
        grad = ", requires_grad=True" if self._node is not None else ""
        return f"tensor({body}{extra}{grad})"

    __hash__ = object.__hash__

    # ------------------------------------------------------------ comparisons (no gradient)

    def __lt__(self, other: Any) -> Tensor:
        return ops.less(self, other)

    def __le__(self, other: Any) -> Tensor:
        return ops.less_equal(self, other)

    def __gt__(self, other: Any) -> Tensor:
        return ops.greater(self, other)

    def __ge__(self, other: Any) -> Tensor:
        return ops.greater_equal(self, other)

    def __eq__(self, other: Any) -> Tensor:  # type: ignore[override]
        return ops.equal(self, other)

    def __ne__(self, other: Any) -> Tensor:  # type: ignore[override]
        return ops.not_equal(self, other)

    # ------------------------------------------------------------ writes

    def __setitem__(self, index: Any, value: Any) -> None:
        """Write in place; not recorded, so not allowed on a tensor that requires grad
        while recording, nor on one whose values a pending backward needs."""
        if self._node is not None and GRAD_ENABLED[0]:
            raise RuntimeError(
                f"setitem: in-place writes are not recorded; this tensor (shape {self.shape}, "
                f"{self.dtype}) requires grad: write under pullback.no_grad() or into .detach()"
            )
        self._check_writeable("setitem")
        value = value._data if isinstance(value, Tensor) else value
        try:
            self._data[ops.shape.normalize_index(index)] = value
        except (ValueError, IndexError, TypeError) as err:
            raise KernelError("setitem", (self._data, np.asarray(value)), str(err)) from None

    def _check_writeable(self, op: str) -> None:
        if not writeable_if_free(self._data):
            saver = saved_by(self._data)
            reason = (f"a pending backward of {saver} needs its values; run backward first "
                      "(or drop the graph), or write into a copy") if saver else \
                "its array is read-only"
            raise RuntimeError(
                f"{op}: cannot write into this tensor (shape {self.shape}, {self.dtype}): {reason}"
            )

    # ------------------------------------------------------------ autograd

    def backward(self, grad: Any = None, retain_graph: bool | None = None,
                 create_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) into each leaf's `.grad` (as PyTorch does).

        `grad` defaults to one for a one-element tensor. The graph's saved
        values are freed afterwards unless `retain_graph` (which
        `create_graph` implies); `create_graph` records the backward itself,
        for higher derivatives.
        """
        from .backward import run_backward

        run_backward(self, grad, retain_graph, create_graph)
