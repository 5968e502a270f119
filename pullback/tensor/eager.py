"""`Tensor` and the eager evaluator that records the graph as ops run.

`evaluate` is what every primitive's `bind` calls for concrete operands: it
runs the primitive's forward on the current backend and, when an operand is
active and recording is on, records a node holding exactly what the
primitive's rules need. Per-op Python overhead is a product metric: keep this
path short.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Literal, SupportsIndex

import numpy as np

from .. import ops
from ..ad import Leaf, LinearVar, Node, Primitive, set_default_evaluator
from ..ad import core as _core
from ..backend.current import ACTIVE as _ACTIVE_BACKEND
from ..backend.current import get_backend
from ..errors import KernelError
from ..ops.elementwise import add_p, div_p, mul_p, sub_p
from ..ops.registry import PRIMITIVES
from .arrays import as_array
from .concrete import CONCRETE_CHECK, check_concrete
from .methods import ElementCount, TorchMethods
from .protect import TensorNode, protect, saved_by, writeable_if_free
from .state import grad_enabled

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from typing_extensions import CapsuleType

    from ..backend import Backend
    from ..ops.hints import ArrayLike, Axis, DTypeLike, Shape, TensorLike
    from ..ops.shape import Index

_new = object.__new__
_FLOATS = frozenset([np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)])
_GRAD_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_Casting = Literal["no", "equiv", "safe", "same_kind", "unsafe"]  # np.can_cast's rules


def _rebuild_leaf(data: NDArray[Any], requires_grad: bool, name: str | None,
                  grad: Tensor | None) -> Tensor:
    """A copied or unpickled leaf tensor (see `Tensor.__reduce_ex__`)."""
    t = Tensor(data, requires_grad=requires_grad)
    if name is not None and isinstance(t._node, Leaf):  # a name is saved for leaves only
        t._node.name = name
    t.grad = grad
    return t


def wrap(data: NDArray[Any], node: Node | Leaf | None) -> Tensor:
    """A tensor around `data` (an array, neither copied nor checked): the output of the
    recorded `node`, or a constant when `node` is None. Every layer above builds its
    tensors from arrays it already owns this way."""
    t = _new(Tensor)
    t._data = data
    t._node = node
    t.grad = None
    return t


_NUMBERS = (bool, int, float)


def evaluate(prim: Primitive, args: tuple[Any, ...], params: dict[str, Any]) -> Tensor:
    """Run `prim` on concrete operands (tensors, arrays, scalars); record if active."""
    backend = _active_backend() or get_backend()
    n_args = len(args)
    arrays: tuple[Any, ...]
    parents: tuple[Node | Leaf | None, ...]
    if n_args == 1:  # the common cases, without building lists
        a = args[0]
        if type(a) is Tensor:
            x = a._data
            parents = (a._node,)
            active = parents[0] is not None
        else:
            x, parents, active = _plain_operand(prim, a, args), (None,), False
            if type(x) in _NUMBERS:  # pb.exp(1.0): an op of one operand needs its dtype
                x = np.asarray(x)
        arrays = (x,)
        impl = prim.impl if not active or prim.saving_impl is None else _forward(prim)
        out = impl(backend, x, **params) if params else impl(backend, x)
    elif n_args == 2:
        a, b = args
        if type(a) is Tensor:
            x, pa = a._data, a._node
        else:
            x, pa = _plain_operand(prim, a, args), None
        if type(b) is Tensor:
            y, pb_ = b._data, b._node
        else:
            y, pb_ = _plain_operand(prim, b, args), None
        arrays, parents = (x, y), (pa, pb_)
        active = pa is not None or pb_ is not None
        impl = prim.impl if not active or prim.saving_impl is None else _forward(prim)
        out = impl(backend, x, y, **params) if params else impl(backend, x, y)
    else:
        arrays = tuple([a._data if type(a) is Tensor else _plain_operand(prim, a, args)
                        for a in args])
        parents = tuple([a._node if type(a) is Tensor else None for a in args])
        active = any(p is not None for p in parents)
        impl = prim.impl if not active or prim.saving_impl is None else _forward(prim)
        out = impl(backend, *arrays, **params)
    result = _new(Tensor)
    result._data = out
    result.grad = None
    if not active or not grad_enabled() or not prim.differentiable or out.dtype not in _FLOATS:
        result._node = None  # integer and bool results carry no gradient
        return result
    # Record: the node keeps exactly what the primitive's rules read.
    node = _new(TensorNode)
    node.primitive = prim
    node.params = params
    node.parents = parents
    node.out_shape = out.shape
    node.dtype = out.dtype
    node.released = False
    if n_args == 1:
        node.in_shapes = (x.shape if type(x) is np.ndarray else (),)
    else:
        node.in_shapes = tuple([v.shape if type(v) is np.ndarray else () for v in arrays])
    name = prim.name
    if prim.saves_inputs:
        for v in arrays:
            if type(v) is np.ndarray and v.dtype is not out.dtype and v.dtype.kind in "iub" \
                    and not prim.exact_inputs:
                arrays = saved_as_float(arrays, out.dtype)
                break
        if prim.bilinear and (parents[0] is None or parents[1] is None):
            # One operand is active: its derivative needs only the other one.
            arrays = (None, arrays[1]) if parents[1] is None else (arrays[0], None)
        node.inputs = arrays
        for v in arrays:
            if type(v) is np.ndarray:
                protect(v, name)
    else:
        node.inputs = None
    if prim.saves_output:
        node.output = out
        protect(out, name)
    else:
        node.output = None
    result._node = node
    return result


def _forward(prim: Primitive) -> Callable[..., Any]:
    """The forward of an application with an active operand: the one that keeps what its
    backward reads (`saving_impl`) when the application is recorded for a backward."""
    saving = prim.saving_impl
    assert saving is not None  # asked only of primitives that declare one
    return saving if grad_enabled() and prim.differentiable else prim.impl


def _plain_operand(prim: Primitive, value: Any, args: tuple[Any, ...]) -> Any:
    """An operand that is not a tensor: an array or a number. Data a user passed by
    mistake is refused here, naming the op, before a backend meets it (None.dtype, a
    list silently made float64, an object array's None read as NaN). None passes where
    it stands for something internal: an optional operand (layer_norm's weight), a
    custom op's absent tangent."""
    kind = type(value)
    if kind is float or kind is int or kind is bool:  # the common case first: x * 2.0
        return value
    if kind is np.ndarray or isinstance(value, (np.ndarray, np.generic)):
        if value.dtype.kind in "fiub":
            return value
    elif value is None:
        if PRIMITIVES.get(prim.name) is not prim or len(args) > 2:
            return value
    elif not isinstance(value, (str, bytes, list, tuple, dict, set)):
        return value  # a number, or an operand of the autodiff core's own
    raise KernelError(prim.name, args, f"operands must be tensors, arrays or numbers, not "
                      f"{_kind(value)}")


def _kind(value: Any) -> str:
    dtype = getattr(value, "dtype", None)
    return f"{type(value).__name__} of dtype {dtype}" if dtype is not None else \
        type(value).__name__


def saved_as_float(arrays: tuple[Any, ...], dtype: np.dtype[Any]) -> tuple[Any, ...]:
    """Integer operands saved as the result's float dtype, so that backward kernels
    (g * other) give gradients in their input's dtype."""
    return tuple(
        x.astype(dtype) if type(x) is np.ndarray and x.dtype.kind in "iub" else x for x in arrays
    )


set_default_evaluator(evaluate)


_NO_PARAMS: dict[str, Any] = {}  # shared by parameterless ops; nothing writes into it
# This thread's evaluator (eager's `evaluate`, every thread's default, or a tracer's) and
# its `use_backend` backend, read through bound methods: one C call each on the hot path.
_Evaluator = Callable[[Primitive, tuple[Any, ...], dict[str, Any]], Any]
_evaluator_now: Callable[[_Evaluator], _Evaluator] = _core.EVALUATOR.get
_active_backend: Callable[[], Backend | None] = _ACTIVE_BACKEND.get


def _binary_operator(prim: Primitive, reflected: bool) -> Callable[[Any, TensorLike], Tensor]:
    """`self (op) other` straight to the installed evaluator (the eager one, or a
    tracer's) when no operand is a linear variable: `bind` without its argument scan.
    (`self` is a tensor or a linear variable; what the evaluator returns acts as a
    tensor.)"""
    if reflected:
        def operator(self: Any, other: Any) -> Any:
            if type(self) is LinearVar or type(other) is LinearVar:
                return prim.bind(other, self)
            return _evaluator_now(evaluate)(prim, (other, self), _NO_PARAMS)
    else:
        def operator(self: Any, other: Any) -> Any:
            if type(self) is LinearVar or type(other) is LinearVar:
                return prim.bind(self, other)
            return _evaluator_now(evaluate)(prim, (self, other), _NO_PARAMS)
    return operator


class _Operators(TorchMethods):
    """Operators and methods shared by `Tensor` and the linear variables of transforms.

    `self` is annotated `Any` in these methods: it is a `Tensor` or a `LinearVar` (which
    gets the methods copied), an operand the ops accept, which the mixin itself is not.
    """

    __slots__ = ()
    __array_priority__ = 1000  # ndarray (op) Tensor defers to us

    __add__ = _binary_operator(add_p, False)
    __radd__ = _binary_operator(add_p, True)
    __sub__ = _binary_operator(sub_p, False)
    __rsub__ = _binary_operator(sub_p, True)
    __mul__ = _binary_operator(mul_p, False)
    __rmul__ = _binary_operator(mul_p, True)
    __truediv__ = _binary_operator(div_p, False)
    __rtruediv__ = _binary_operator(div_p, True)

    def __pow__(self: Any, other: TensorLike) -> Tensor:
        return ops.pow(self, other)

    def __rpow__(self: Any, other: TensorLike) -> Tensor:
        return ops.pow(other, self)

    def __matmul__(self: Any, other: TensorLike) -> Tensor:
        return ops.matmul(self, other)

    def __rmatmul__(self: Any, other: TensorLike) -> Tensor:
        return ops.matmul(other, self)

    def __neg__(self: Any) -> Tensor:
        return ops.neg(self)

    def __pos__(self: Any) -> Tensor:
        return self  # type: ignore[no-any-return]  # a tensor (or a linear variable)

    def __getitem__(self: Any, index: Index) -> Tensor:
        return ops.getitem(self, index)

    @property
    def T(self: Any) -> Tensor:
        return ops.transpose(self)

    def sum(self: Any, axis: Axis = None, keepdims: bool = False) -> Tensor:
        return ops.sum(self, axis, keepdims)

    def mean(self: Any, axis: Axis = None, keepdims: bool = False) -> Tensor:
        return ops.mean(self, axis, keepdims)

    def reshape(self: Any, *shape: int | Sequence[int]) -> Tensor:
        return ops.reshape(self, *shape)

    def transpose(self: Any, axes: Sequence[int] | None = None) -> Tensor:
        return ops.transpose(self, axes)

    def broadcast_to(self: Any, shape: Sequence[int]) -> Tensor:
        return ops.broadcast_to(self, shape)

    def astype(self: Any, dtype: DTypeLike) -> Tensor:
        return ops.astype(self, np.dtype(dtype))

    def matmul(self: Any, other: TensorLike) -> Tensor:
        return ops.matmul(self, other)

    if TYPE_CHECKING:
        # The methods primitives declare (`tensor_method`, set below at import), spelled
        # for type checkers, which cannot see `setattr`; tests/tensor/test_method_types.py
        # checks that this list and the primitives' agree.
        abs = ops.abs
        argmax = ops.argmax
        argmin = ops.argmin
        argsort = ops.argsort
        clip = ops.clip
        cos = ops.cos
        cumsum = ops.cumsum
        exp = ops.exp
        gelu = ops.gelu
        log = ops.log
        log_softmax = ops.log_softmax
        logsumexp = ops.logsumexp
        max = ops.max
        maximum = ops.maximum
        min = ops.min
        minimum = ops.minimum
        neg = ops.neg
        prod = ops.prod
        relu = ops.relu
        sigmoid = ops.sigmoid
        silu = ops.silu
        sin = ops.sin
        softmax = ops.softmax
        softplus = ops.softplus
        sqrt = ops.sqrt
        tanh = ops.tanh


# The methods each primitive declares (`tensor_method`, beside its declaration).
for _prim in PRIMITIVES.values():
    if _prim.method is not None:
        setattr(_Operators, _prim.method.__name__, _prim.method)

# A linear variable behaves like a tensor inside `linear_transpose`'s function.
for _name, _value in {**vars(TorchMethods), **vars(_Operators)}.items():
    if _name not in ("__slots__", "__doc__", "__module__", "__dict__", "__qualname__"):
        setattr(LinearVar, _name, _value)


class Tensor(_Operators):
    """An n-dimensional array that can record the ops applied to it.

    Build one with `pullback.tensor`. A tensor that requires grad is a leaf
    (its `.grad` collects gradients) or the output of recorded ops.
    """

    __slots__ = ("__weakref__", "_data", "_node", "grad")
    _data: NDArray[Any]  # the values (read-only while a pending backward needs them)
    _node: Node | Leaf | None  # what recorded it; None: it requires no grad
    grad: Tensor | None  # a leaf's accumulated gradient

    def __init__(self, data: Tensor | ArrayLike, dtype: DTypeLike | None = None,
                 requires_grad: bool = False) -> None:
        self._data = as_array(data._data if isinstance(data, Tensor) else data, dtype)
        self._node = None
        self.grad = None
        if requires_grad:
            self.requires_grad = True

    # ------------------------------------------------------------ attributes

    @property
    def shape(self) -> Shape:
        return self._data.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self._data.dtype

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> ElementCount:
        """The element count (an int, as NumPy's `a.size`); called, the shape (as
        PyTorch's `x.size()`), or one dimension's length (`x.size(1)`)."""
        return ElementCount(self._data.shape)

    def __len__(self) -> int:
        if not self._data.ndim:
            raise TypeError("len() of a 0-d tensor")
        return len(self._data)

    def __iter__(self) -> Iterator[Tensor]:
        """The tensor's rows along its first axis, as `q, k, v = t` unpacks them."""
        if not self._data.ndim:
            raise TypeError("iteration over a 0-d tensor")
        return (ops.getitem(self, i) for i in range(len(self._data)))

    @property
    def requires_grad(self) -> bool:
        return self._node is not None

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if value:
            if self._node is not None:
                return
            if self._data.dtype not in _GRAD_DTYPES:
                raise TypeError(
                    f"requires_grad: only float32 and float64 tensors can require grad; this "
                    f"one is {self._data.dtype} with shape {self.shape}"
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

    def numpy(self) -> NDArray[Any]:
        """The data as a NumPy array, sharing memory with the tensor (read-only while
        a pending backward needs it)."""
        check_concrete(self, "t.numpy()")
        data = self._data
        if not data.flags.writeable:
            writeable_if_free(data)
        return data

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> NDArray[Any]:
        check_concrete(self, "np.asarray(t)")
        if dtype is not None and dtype != self._data.dtype:
            return self._data.astype(dtype)
        return self._data.copy() if copy else self._data

    def __dlpack__(self, *args: Any, **kwargs: Any) -> CapsuleType:
        """DLPack export, sharing memory (how `torch.from_dlpack(t)` reads a tensor); an
        array a pending backward needs is not exported: the importer could write into it
        (NumPy marks it read-only, which PyTorch's import does not keep)."""
        check_concrete(self, "t.__dlpack__() (from_dlpack)")
        data = self._data
        if not data.flags.writeable and not writeable_if_free(data):
            saver = saved_by(data)
            if saver is not None:
                raise BufferError(
                    f"__dlpack__: cannot share this tensor's memory (shape {self.shape}, "
                    f"{self.dtype}): a pending backward of {saver} needs its values; run "
                    "backward first, or share a copy (t.detach().clone())")
        return data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._data.__dlpack_device__()

    def item(self) -> int | float | bool:
        check_concrete(self, "t.item()")
        return self._item("item")

    def _item(self, operation: str) -> int | float | bool:
        if self._data.size != 1:
            raise ValueError(f"{operation}: only a one-element tensor has an item; shape is "
                             f"{self.shape}")
        value: int | float | bool = self._data.item()
        return value

    def tolist(self) -> list[Any] | int | float | bool:
        """The values as nested lists of Python numbers (a number for a 0-d tensor)."""
        check_concrete(self, "t.tolist()")
        values: list[Any] | int | float | bool = self._data.tolist()
        return values

    def __float__(self) -> float:
        check_concrete(self, "float(t)")
        return float(self._item("float"))

    def __int__(self) -> int:
        check_concrete(self, "int(t)")
        return int(self._item("int"))

    def __bool__(self) -> bool:
        check_concrete(self, "bool(t) (a Python `if`, `and`, `or` or `not` on a tensor)")
        if self._data.size != 1:
            raise ValueError(
                f"the truth value of a tensor with {self._data.size} elements is ambiguous"
            )
        return bool(self._data)

    def detach(self) -> Tensor:
        """The same data, cut from the graph."""
        return wrap(self._data, None)

    def clone(self) -> Tensor:
        if self._node is not None or (CONCRETE_CHECK.get() is not None
                                      and self._data.dtype.kind in "fiuc"):
            return ops.mul(self, 1)  # recorded (a copy of a traced value is not baked)
        return wrap(self._data.copy(), None)

    # A leaf's node refers back to its tensor through a weak reference, which copy and
    # pickle would share or refuse: a deep copy of a module would send its gradients to
    # the original's parameters. A copy gets its own leaf (and its parameter name).
    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        if self._node is not None and self._node.primitive is not None:
            raise RuntimeError(
                f"copy/pickle: only leaf tensors can be copied or pickled; this one (shape "
                f"{self.shape}, dtype {self.dtype}) was computed by "
                f"{self._node.primitive.name}: copy t.detach() instead"
            )
        name = self._node.name if isinstance(self._node, Leaf) else None
        return _rebuild_leaf, (self._data, self._node is not None, name, self.grad)

    def __repr__(self) -> str:
        body = np.array2string(self._data, separator=", ", prefix="tensor(")
        extra = f", dtype={self.dtype}" if self.dtype != np.float32 else ""
        grad = ", requires_grad=True" if self._node is not None else ""
        return f"tensor({body}{extra}{grad})"

    __hash__ = object.__hash__

    # ------------------------------------------------------------ comparisons (no gradient)

    def __lt__(self, other: TensorLike) -> Tensor:
        return ops.less(self, other)

    def __le__(self, other: TensorLike) -> Tensor:
        return ops.less_equal(self, other)

    def __gt__(self, other: TensorLike) -> Tensor:
        return ops.greater(self, other)

    def __ge__(self, other: TensorLike) -> Tensor:
        return ops.greater_equal(self, other)

    def __eq__(self, other: TensorLike) -> Tensor:  # type: ignore[override]  # elementwise, as NumPy's
        return ops.equal(self, other)

    def __ne__(self, other: TensorLike) -> Tensor:  # type: ignore[override]  # elementwise, as NumPy's
        return ops.not_equal(self, other)

    # ------------------------------------------------------------ writes

    def __setitem__(self, index: Index, value: TensorLike) -> None:
        """Write in place; not recorded, so not allowed on a tensor that requires grad
        while recording, nor on one whose values a pending backward needs."""
        if self._node is not None and grad_enabled():
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
        # A writeable view of a saved array (made before it was saved) is refused too.
        if not writeable_if_free(self._data) or saved_by(self._data) is not None:
            saver = saved_by(self._data)
            reason = (f"a pending backward of {saver} needs its values; run backward first "
                      "(or drop the graph), or write into a copy") if saver else \
                "its array is read-only"
            raise RuntimeError(
                f"{op}: cannot write into this tensor (shape {self.shape}, {self.dtype}): {reason}"
            )

    # ------------------------------------------------------------ in place (PyTorch's rules)

    def __iadd__(self, other: TensorLike) -> Tensor:
        return self._arithmetic_in_place("add_", add_p, other)

    def __isub__(self, other: TensorLike) -> Tensor:
        return self._arithmetic_in_place("sub_", sub_p, other)

    def __imul__(self, other: TensorLike) -> Tensor:
        return self._arithmetic_in_place("mul_", mul_p, other)

    def __itruediv__(self, other: TensorLike) -> Tensor:
        return self._arithmetic_in_place("div_", div_p, other)

    def add_(self, other: TensorLike, alpha: float = 1) -> Tensor:
        """self += alpha * other, in place."""
        return self._arithmetic_in_place("add_", add_p, other, alpha)

    def sub_(self, other: TensorLike, alpha: float = 1) -> Tensor:
        """self -= alpha * other, in place."""
        return self._arithmetic_in_place("sub_", sub_p, other, alpha)

    def mul_(self, other: TensorLike) -> Tensor:
        return self._arithmetic_in_place("mul_", mul_p, other)

    def div_(self, other: TensorLike) -> Tensor:
        return self._arithmetic_in_place("div_", div_p, other)

    def _arithmetic_in_place(self, op: str, prim: Primitive, other: TensorLike,
                             alpha: float = 1) -> Tensor:
        def compute() -> Any:  # a tensor, or the value a tracer computes
            operand = other
            dtype = getattr(other, "dtype", None)
            if dtype is not None and not isinstance(other, np.generic) and dtype != self.dtype \
                    and dtype.kind == "f" and self._data.dtype.kind == "f":
                # As PyTorch: an operand of the other float dtype is cast to this tensor's
                # (f32 += f64 stays f32), where out-of-place ops refuse the mix.
                operand = ops.astype(other, self.dtype)
            if alpha != 1:
                operand = mul_p.bind(operand, alpha)
            return prim.bind(self, operand)

        return self._in_place(op, compute, other)

    def fill_(self, value: float | np.number[Any] | np.bool_ | Tensor) -> Tensor:
        """Every element set to the number (or 0-d tensor) `value`, in place."""
        if not isinstance(value, (bool, int, float, np.number, np.bool_)) and not (
                type(value) is Tensor and value.ndim == 0):
            raise TypeError(f"fill_: the fill value must be a number or a 0-d tensor, got "
                            f"{type(value).__name__}")
        return self._in_place("fill_", lambda: self._overwritten(value), value, "unsafe",
                              True)

    def zero_(self) -> Tensor:
        return self.fill_(0)

    def copy_(self, src: TensorLike) -> Tensor:
        """`src`'s values (broadcast to this shape, cast to this dtype) written in place;
        while recording, gradients flow to `src` as PyTorch's copy_ sends them."""
        if not isinstance(src, (Tensor, np.ndarray, bool, int, float, np.number, np.bool_)):
            raise TypeError(f"copy_: expected a tensor or an array, got {type(src).__name__}")
        return self._in_place("copy_", lambda: self._overwritten(src), src, "unsafe", True)

    def _overwritten(self, value: TensorLike) -> Tensor | NDArray[Any]:
        """This tensor's values replaced by `value`: a recorded `where` when gradients
        flow (to `value`, none to the old values), plain data otherwise."""
        active = type(value) is Tensor and value._node is not None
        if grad_enabled() and (active or self._node is not None) and \
                self._data.dtype.kind == "f":
            if type(value) is Tensor and value.dtype != self.dtype:
                value = ops.astype(value, self.dtype)
            return ops.where(np.ones(self.shape, np.bool_), value, self)
        data = value._data if type(value) is Tensor else np.asarray(value)
        try:
            return np.broadcast_to(data, self.shape)
        except ValueError:
            raise KernelError("copy_", (self._data, data),
                              f"cannot broadcast the source to {self.shape}") from None

    def _in_place(self, op: str, compute: Callable[[], Any], other: TensorLike,
                  casting: _Casting = "same_kind", replaces: bool = False) -> Tensor:
        """Write `compute()` into this tensor, as PyTorch's in-place ops do: allowed under
        no_grad or on a tensor that does not require grad; on a leaf that requires grad
        only under no_grad; on a recorded result it is recorded (the tensor takes the
        new node). Values a pending backward saved are never overwritten. `replaces`: the
        new values are `other` itself (copy_, fill_), which is what a tracer records."""
        if grad_enabled() and self._node is not None and self._node.primitive is None:
            raise RuntimeError(
                f"{op}: a leaf tensor that requires grad (shape {self.shape}, {self.dtype}) "
                "cannot be changed in place while gradients are recorded; update it under "
                "pullback.no_grad(), as an optimizer step does"
            )
        evaluator = _evaluator_now(evaluate)
        if evaluator is not evaluate:
            # A tracer records the write as state its plan repeats at every call (a
            # buffer's update), or refuses it; one without that notion refuses.
            write = getattr(evaluator, "write_state", None)
            if write is None:
                raise RuntimeError(f"{op}: in-place ops cannot be traced or compiled; write "
                                   "x = x + y instead")
            written: Tensor = write(self, op, other if replaces else compute())
            return written
        self._check_writeable(op)
        try:
            result = compute()
        except KernelError as err:  # named for the in-place op the user called
            other = other._data if type(other) is Tensor else other
            raise KernelError(op, (self._data, other), err.reason) from None
        node = result._node if type(result) is Tensor else None
        out = result._data if type(result) is Tensor else result
        if out.shape != self.shape:
            raise KernelError(op, (self._data, out), f"the result has shape {out.shape}; an "
                              "in-place op cannot change the tensor's shape")
        if out.dtype != self.dtype and not np.can_cast(out.dtype, self.dtype, casting):
            raise KernelError(op, (self._data, out), f"the result is {out.dtype}, which an "
                              f"in-place op cannot write into a {self.dtype} tensor")
        if node is None:
            np.copyto(self._data, out, casting="unsafe")
            return self
        # Recorded: write into the array when nothing else sees it change behind the graph
        # (not saved by the op just recorded, not a view of another tensor's array);
        # otherwise the tensor takes the result's array.
        if self._data.base is None and writeable_if_free(self._data) and \
                saved_by(self._data) is None:
            np.copyto(self._data, out)
        else:
            self._data = out
        self._node = node
        return self

    # `backward` is attached by backward.py, beside the engine it runs: that module
    # imports this one, so the method cannot be defined here without an import cycle.
    if TYPE_CHECKING:
        def backward(self, grad: TensorLike | None = None, retain_graph: bool | None = None,
                     create_graph: bool = False) -> None: ...
