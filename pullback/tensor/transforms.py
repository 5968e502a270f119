"""Function transforms in the JAX manner: grad, value_and_grad, vjp, jvp,
linearize, linear_transpose.

Each records the function once on fresh inputs, then asks the autodiff core
for what it needs. Transforms nest: when a transform's inputs or the values
it closes over are themselves being differentiated by an outer transform,
its backward is recorded (create_graph), so grad(grad(f)) works.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast, overload

import numpy as np

from ..ad import (
    Leaf,
    LinearGraph,
    LinearVar,
    Zero,
    backward_pass,
    evaluate_linear,
    linearize_graph,
    toposort,
    transpose_linear,
)
from ..ops.shape import identity
from .arrays import as_array
from .backward import EagerExecutor, initial_cotangent, owned
from .eager import Tensor, wrap
from .state import grad_enabled, grad_mode

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from ..ops.hints import TensorLike

_P = ParamSpec("_P")
# What a differentiated function returns: a tensor, or a tuple (or list) of tensors.
_Out = TypeVar("_Out", bound="Tensor | Sequence[Tensor]")
_Outs = TypeVar("_Outs", bound="Sequence[Tensor]")


def _trace_inputs(op: str, primals: Sequence[TensorLike]) -> tuple[list[Tensor], bool]:
    """Fresh differentiation inputs for `primals`; True if any is already being traced."""
    inputs: list[Tensor] = []
    nested = False
    for index, p in enumerate(primals):
        t = p if isinstance(p, Tensor) else wrap(as_array(p), None)
        if t.dtype.kind != "f":
            raise TypeError(
                f"{op}: argument {index} has dtype {t.dtype} (shape {t.shape}); "
                "only floating inputs can be differentiated"
            )
        if t._node is not None and grad_enabled():
            nested = True
            with grad_mode(True):
                inputs.append(identity(t))
        else:
            fresh = wrap(t._data, None)
            fresh._node = Leaf(t.shape, t.dtype)
            inputs.append(fresh)
    return inputs, nested


def _outputs(op: str, out: object) -> tuple[tuple[Tensor, ...], bool]:
    if isinstance(out, Tensor):
        return (out,), True
    if isinstance(out, (tuple, list)) and all(isinstance(o, Tensor) for o in out):
        return tuple(out), False
    raise TypeError(f"{op}: the function must return a tensor or a tuple of tensors, "
                    f"not {type(out).__name__}")


def _records_outside(outs: Sequence[Tensor], inputs: Sequence[Tensor]) -> bool:
    """Whether the outputs depend on tensors an outer computation differentiates."""
    if not grad_enabled():
        return False
    ours = {id(i._node) for i in inputs}
    roots = [o._node for o in outs if o._node is not None]
    return any(n.primitive is None and id(n) not in ours for n in toposort(roots))


def _result(ct: NDArray[Any] | Tensor | None, like: Tensor) -> Tensor:
    if ct is None:
        return wrap(np.zeros(like.shape, like.dtype), None)  # the output does not depend on it
    return ct if isinstance(ct, Tensor) else wrap(ct, None)


def vjp(f: Callable[..., _Out], *primals: TensorLike
        ) -> tuple[_Out, Callable[[TensorLike | Sequence[TensorLike] | None], tuple[Tensor, ...]]]:
    """`(f(*primals), vjp_fn)`; `vjp_fn(cotangent)` returns one gradient per primal.

    The cotangent has the output's shape (a tuple of them for a tuple of outputs); None
    stands for one, for a one-element output."""
    inputs, nested = _trace_inputs("vjp", primals)
    with grad_mode(True):
        out = f(*inputs)
    outs, single = _outputs("vjp", out)
    targets = [i._node for i in inputs]
    outer = nested or _records_outside(outs, inputs)
    executors: dict[bool, EagerExecutor] = {}

    def vjp_fn(cotangent: TensorLike | Sequence[TensorLike] | None) -> tuple[Tensor, ...]:
        given: tuple[Any, ...] = (cotangent,) if single else tuple(
            cast("Sequence[TensorLike]", cotangent))
        if len(given) != len(outs):
            raise ValueError(f"vjp: expected {len(outs)} cotangents, got {len(given)}")
        cts = [initial_cotangent("vjp", o, c) for o, c in zip(outs, given)]
        create = outer or any(isinstance(c, Tensor) for c in cts)
        executor = executors.get(create) or executors.setdefault(
            create, EagerExecutor(create_graph=create, memoize=True))
        roots = [(o._node, c if create else _data(c)) for o, c in zip(outs, cts)
                 if o._node is not None]
        results = backward_pass(roots, executor, targets=targets)
        grads = owned([results.get(t) for t in targets], tuple(c for _, c in roots))
        return tuple(_result(g, i) for g, i in zip(grads, inputs))

    return (out if outer else _detached(out)), vjp_fn


def _detached(out: _Out) -> _Out:
    """Outputs cut from the transform's private graph (nothing outside can use it)."""
    if isinstance(out, Tensor):
        return cast("_Out", wrap(out._data, None))
    return cast("_Out", type(out)(wrap(o._data, None) for o in out))  # type: ignore[call-arg]  # a tuple or a list


def _data(x: Any) -> Any:
    return x._data if isinstance(x, Tensor) else x


@overload
def value_and_grad(f: Callable[_P, Tensor], argnums: int = 0
                   ) -> Callable[_P, tuple[Tensor, Tensor]]: ...


@overload
def value_and_grad(f: Callable[_P, Tensor], argnums: Sequence[int]
                   ) -> Callable[_P, tuple[Tensor, tuple[Tensor, ...]]]: ...


def value_and_grad(f: Callable[_P, Tensor], argnums: int | Sequence[int] = 0
                   ) -> Callable[_P, tuple[Tensor, Tensor | tuple[Tensor, ...]]]:
    """A function returning `(f(*args), gradient)`; with a tuple `argnums`, a tuple of
    gradients. `f` must return a one-element tensor."""
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    fn: Callable[..., Tensor] = f  # called with some arguments replaced

    def value_and_grad_f(*args: _P.args, **kwargs: _P.kwargs
                         ) -> tuple[Tensor, Tensor | tuple[Tensor, ...]]:
        if any(not -len(args) <= n < len(args) for n in nums):
            raise ValueError(f"grad: argnums {argnums} out of range for {len(args)} arguments")
        given: tuple[Any, ...] = args  # the differentiated ones are tensor-like, as vjp checks

        def partial(*chosen: Tensor) -> Tensor:
            full = list(given)
            for n, value in zip(nums, chosen):
                full[n] = value
            return fn(*full, **kwargs)

        out, vjp_fn = vjp(partial, *(given[n] for n in nums))
        if not isinstance(out, Tensor) or out.size != 1:
            shape = getattr(out, "shape", type(out).__name__)
            raise TypeError(f"grad: the function must return a one-element tensor, got {shape}")
        grads = vjp_fn(None)
        return out, grads[0] if isinstance(argnums, int) else grads

    return value_and_grad_f


@overload
def grad(f: Callable[_P, Tensor], argnums: int = 0) -> Callable[_P, Tensor]: ...


@overload
def grad(f: Callable[_P, Tensor], argnums: Sequence[int]
         ) -> Callable[_P, tuple[Tensor, ...]]: ...


def grad(f: Callable[_P, Tensor], argnums: int | Sequence[int] = 0
         ) -> Callable[_P, Tensor | tuple[Tensor, ...]]:
    """A function returning the gradient of one-element `f` with respect to `argnums`
    (with a tuple `argnums`, a tuple of gradients)."""
    value_and_grad_f = value_and_grad(f, argnums)

    def grad_f(*args: _P.args, **kwargs: _P.kwargs) -> Tensor | tuple[Tensor, ...]:
        return value_and_grad_f(*args, **kwargs)[1]

    return grad_f


@overload
def linearize(f: Callable[..., Tensor], *primals: TensorLike
              ) -> tuple[Tensor, Callable[..., Tensor]]: ...


@overload
def linearize(f: Callable[..., _Outs], *primals: TensorLike
              ) -> tuple[_Outs, Callable[..., tuple[Tensor, ...]]]: ...


@overload
def linearize(f: Callable[..., Tensor | Sequence[Tensor]], *primals: TensorLike
              ) -> tuple[Tensor | Sequence[Tensor], Callable[..., Tensor | tuple[Tensor, ...]]]: ...


def linearize(f: Callable[..., Tensor | Sequence[Tensor]], *primals: TensorLike
              ) -> tuple[Tensor | Sequence[Tensor], Callable[..., Tensor | tuple[Tensor, ...]]]:
    """`(f(*primals), f_jvp)` where `f_jvp(*tangents)` is the linear map at the primals
    (one tangent per primal; a tensor out for a tensor `f` returns, else a tuple)."""
    inputs, nested = _trace_inputs("linearize", primals)
    with grad_mode(True):
        out = f(*inputs)
    outs, single = _outputs("linearize", out)
    create = nested or _records_outside(outs, inputs)
    executor = EagerExecutor(create_graph=create)
    with grad_mode(create):
        graph = linearize_graph([o._node for o in outs if o._node is not None],
                                [i._node for i in inputs], executor)
    produced = iter(graph.outputs)
    graph.outputs = [next(produced) if o._node is not None else Zero(o.shape, o.dtype)
                     for o in outs]

    def f_jvp(*tangents: TensorLike) -> Tensor | tuple[Tensor, ...]:
        if len(tangents) != len(inputs):
            raise ValueError(f"linearize: expected {len(inputs)} tangents, got {len(tangents)}")
        ts = [_tangent("linearize", t, i) for t, i in zip(tangents, inputs)]
        active = create or any(isinstance(t, Tensor) and t._node is not None for t in ts)
        with grad_mode(active):
            results = evaluate_linear(graph, ts)
        # A tangent that reaches an output unchanged (f adds a constant) is the caller's
        # array: it comes back as a tensor of its own, as every other result.
        results = [_result(None, o) if type(r) is Zero else
                   wrap(np.array(r), None) if isinstance(r, np.ndarray) else r
                   for r, o in zip(results, outs)]
        return results[0] if single else tuple(results)

    return (out if create else _detached(out)), f_jvp


def _tangent(op: str, t: Any, like: Tensor) -> Any:
    """A tangent as the linear graph takes it: a recorded tensor, an array, or a linear
    variable (when `f_jvp` is itself transposed)."""
    if type(t) is LinearVar:
        return t
    data = t._data if isinstance(t, Tensor) else np.asarray(t, dtype=like.dtype)
    if data.shape != like.shape or data.dtype != like.dtype:
        raise ValueError(f"{op}: a tangent has shape {data.shape} and dtype {data.dtype}, but "
                         f"its primal has shape {like.shape} and dtype {like.dtype}")
    return t if isinstance(t, Tensor) and t._node is not None else data


@overload
def jvp(f: Callable[..., Tensor], primals: Sequence[TensorLike], tangents: Sequence[TensorLike]
        ) -> tuple[Tensor, Tensor]: ...


@overload
def jvp(f: Callable[..., _Outs], primals: Sequence[TensorLike], tangents: Sequence[TensorLike]
        ) -> tuple[_Outs, tuple[Tensor, ...]]: ...


@overload
def jvp(f: Callable[..., Tensor | Sequence[Tensor]], primals: Sequence[TensorLike],
        tangents: Sequence[TensorLike]
        ) -> tuple[Tensor | Sequence[Tensor], Tensor | tuple[Tensor, ...]]: ...


def jvp(f: Callable[..., Tensor | Sequence[Tensor]], primals: Sequence[TensorLike],
        tangents: Sequence[TensorLike]
        ) -> tuple[Tensor | Sequence[Tensor], Tensor | tuple[Tensor, ...]]:
    """`(f(*primals), J(primals) @ tangents)`: forward mode, from the same JVP rules."""
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents):
        raise ValueError(f"jvp: {len(primals)} primals but {len(tangents)} tangents")
    out, f_jvp = linearize(f, *primals)
    return out, f_jvp(*tangents)


def linear_transpose(f_lin: Callable[..., Tensor | Sequence[Tensor]], *primals: TensorLike
                     ) -> Callable[[TensorLike | Sequence[TensorLike]], tuple[Tensor, ...]]:
    """The transpose of linear `f_lin`; `primals` give its inputs' shapes and dtypes.

    The result, called with one output cotangent (a tuple for several outputs),
    returns a tuple with one cotangent per input.
    """
    likes = [p if isinstance(p, Tensor) else wrap(as_array(p), None) for p in primals]
    graph = LinearGraph()
    variables = [graph.new_input(p.shape, p.dtype) for p in likes]
    out: Any = f_lin(*variables)  # linear variables (or constants), acting as tensors
    single = not isinstance(out, (tuple, list))
    outs: tuple[Any, ...] = (out,) if single else tuple(out)
    for o in outs:
        if type(o) is not LinearVar and type(o) is not Zero and np.any(_data(o) != 0):
            raise TypeError("linear_transpose: the function's output is not a linear function "
                            "of its inputs (it has a constant part)")
    graph.outputs = [o if type(o) is LinearVar else None for o in outs]

    def f_transpose(cotangent: TensorLike | Sequence[TensorLike]) -> tuple[Tensor, ...]:
        cts: tuple[Any, ...] = (cotangent,) if single else tuple(
            cast("Sequence[TensorLike]", cotangent))
        if len(cts) != len(outs):
            raise ValueError(f"linear_transpose: expected {len(outs)} cotangents, got {len(cts)}")
        values: list[Tensor] = []
        for c, o in zip(cts, outs):
            data = c if isinstance(c, Tensor) else wrap(np.asarray(c, dtype=o.dtype), None)
            if data.shape != o.shape:
                raise ValueError(f"linear_transpose: cotangent has shape {data.shape}, "
                                 f"the output has shape {o.shape}")
            values.append(data)
        results = transpose_linear(graph, values, lambda a, b: a + b)
        return tuple(_result(r, p) for r, p in zip(results, likes))

    return f_transpose
