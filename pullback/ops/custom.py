"""`CustomOp`: users' own ops, written in NumPy, with an optional backward and JVP.

Each subclass becomes a primitive named after it. Its derivative is a linear
companion primitive: evaluated forwards it calls the op's `jvp`, transposed it
calls the op's `backward`, so forward mode, reverse mode and gradcheck all go
through the core's usual machinery without tracing the user's NumPy code. An
op without `backward` is inference-only: differentiating through it is an
error naming the class, never a zero.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..ad import (
    ALL_ARGS,
    DerivativeError,
    ForwardModeError,
    Primitive,
    Zero,
    defjvp_full,
    deflinear,
    defvjp,
    leaves_above,
)
from ..backend.base import Backend
from ..errors import KernelError
from .hints import TensorLike
from .registry import declare

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["CustomOp"]


class CustomOp:
    """Subclass with `forward(self, *arrays) -> array` and, to be trainable,
    `backward(self, upstream, inputs, output) -> tuple` (one gradient or None per
    input); optionally `jvp(self, tangents, inputs, output) -> array` (tangents
    has None for inputs that carry none) for forward mode. Call an instance on
    tensors: `MyOp()(x, y)`. Forward and backward see and return NumPy arrays.

    `saves` says what backward (and jvp) read, and so what a pending backward
    keeps alive and read-only: "inputs", "output", both (the default) or
    neither. What is not saved reaches backward as None (`inputs` then holds
    None for each input), and an unsaved input may be written after forward.
    """

    saves: tuple[str, ...] = ("inputs", "output")
    # The op's primitive and its linear companion, made at its first call (`_primitives`).
    _pullback_primitives: ClassVar[tuple[Primitive, Primitive]]

    if TYPE_CHECKING:
        # Spelled as callables so that a subclass names and types its own parameters
        # (`forward(self, x, y)`; `output: np.ndarray` where `saves` keeps it); what
        # they return is still checked.
        forward: Callable[..., NDArray[Any]]
        backward: Callable[..., Sequence[ArrayLike | None]]
        """`backward(upstream, inputs, output)`: one gradient (or None) per input; an op
        that defines it is trainable. `inputs` is a tuple of arrays (of Nones where
        `saves` leaves them out), `output` an array (None where left out)."""
        jvp: Callable[..., ArrayLike]
        """`jvp(tangents, inputs, output)`: the output's tangent, for forward mode
        (optional); `tangents` holds None for an input that carries none."""
    else:

        def forward(self, *arrays: NDArray[Any]) -> NDArray[Any]:
            raise TypeError(f"{type(self).__name__} defines no forward()")

    def __call__(self, *args: TensorLike) -> Tensor:
        prim = _primitives(type(self))[0]
        if prim.saves_output:
            return prim.bind(*args, op=self)
        # The output is not kept, but its shape and dtype are: forward mode's linear
        # companion is built from them.
        return prim.bind(*args, op=self, spec=_OutputSpec())

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _defines(op: CustomOp | type[CustomOp], method: str) -> bool:
    cls = op if isinstance(op, type) else type(op)
    return getattr(cls, method, None) is not getattr(CustomOp, method, None)


def _primitives(cls: type[CustomOp]) -> tuple[Primitive, Primitive]:
    """The op's primitive and its linear companion, made once per subclass."""
    cached = cls.__dict__.get("_pullback_primitives")
    if cached is None:
        cached = _declare(cls)
        cls._pullback_primitives = cached
    return cached


class _OutputSpec:
    """The shape and dtype of an output that is not saved, filled in by forward."""

    __slots__ = ("dtype", "shape")


def _saves(cls: type[CustomOp]) -> tuple[bool, bool]:
    saves = cls.saves
    if isinstance(saves, str) or not isinstance(saves, (tuple, list, frozenset, set)) \
            or not set(saves) <= {"inputs", "output"}:
        raise TypeError(f"{cls.__name__}.saves must be a tuple of \"inputs\" and/or "
                        f"\"output\", not {saves!r}")
    return "inputs" in saves, "output" in saves


def _declare(cls: type[CustomOp]) -> tuple[Primitive, Primitive]:
    name = cls.__name__
    saves_inputs, saves_output = _saves(cls)

    def impl(backend: Backend, *arrays: Any, op: CustomOp, spec: Any = None) -> np.ndarray:
        out = op.forward(*arrays)
        if not isinstance(out, np.ndarray):
            raise KernelError(name, arrays, f"forward returned a {type(out).__name__}, not a "
                              "NumPy array")
        if spec is not None:
            spec.shape, spec.dtype = out.shape, out.dtype
        return out

    def no_shape_rule(*args: Any, op: CustomOp, spec: Any = None) -> tuple[Any, ...]:
        raise DerivativeError(f"{name} is not linear; it cannot be applied to a tangent")

    prim = declare(name, impl, no_shape_rule, saves_inputs=saves_inputs,
                   saves_output=saves_output, register=False)
    prim.exact_inputs = True  # the user's backward sees its inputs as they were given

    def linear_impl(backend: Backend, *tangents: Any, op: CustomOp, inputs: tuple[Any, ...],
                    output: np.ndarray | None, spec: Any = None) -> np.ndarray:
        if not _defines(op, "jvp"):
            raise ForwardModeError(f"{name} defines no jvp(): forward mode through it is "
                                   "unsupported (reverse mode needs only backward())")
        tangents = tuple(None if type(t) is Zero else t for t in tangents)
        like = output if output is not None else spec
        return _checked(name, "jvp", op.jvp(tangents, inputs, output), like)

    def linear_shape(*tangents: Any, op: CustomOp, inputs: tuple[Any, ...],
                     output: np.ndarray | None, spec: Any = None) -> tuple[Any, ...]:
        like = output if output is not None else spec
        return like.shape, like.dtype

    linear = declare(f"{name}.jvp", linear_impl, linear_shape, register=False)

    def transpose(ct: Any, *tangents: Any, op: CustomOp, inputs: tuple[Any, ...],
                  output: np.ndarray | None, spec: Any = None) -> tuple[Any, ...]:
        if getattr(ct, "_node", None) is not None:
            raise DerivativeError(f"{name}.backward is NumPy code: second derivatives through "
                                  f"{name} are unsupported")
        # An input with a symbolic-zero tangent is inactive: it may get no gradient.
        active = tuple(type(t) is not Zero for t in tangents)
        return _backward(op, getattr(ct, "_data", ct), inputs, output, active, tangents)

    # Linear in its tangents: its own JVP is itself.
    defjvp_full(linear, lambda tangents, _output, _inputs, **params: linear.bind(*tangents,
                                                                                  **params))
    deflinear(linear, transpose, linear_args=ALL_ARGS)

    def jvp(tangents: tuple[Any, ...], output: Any, inputs: tuple[Any, ...], op: CustomOp,
            spec: Any = None) -> Any:
        if any(getattr(v, "_node", None) is not None for v in (*inputs, output)):
            # The derivative is being recorded to be differentiated again, but the op's
            # backward and jvp are NumPy code: the result would silently be a constant.
            raise DerivativeError(f"{name}.backward is NumPy code: second derivatives "
                                  f"through {name} are unsupported")
        if spec is not None:
            return linear.bind(*tangents, op=op, inputs=_arrays(inputs), output=_array(output),
                               spec=spec)
        return linear.bind(*tangents, op=op, inputs=_arrays(inputs), output=_array(output))

    if _defines(cls, "backward") or _defines(cls, "jvp"):
        # Without either the op has no derivative rule at all: inference-only, and
        # differentiating through it (or lowering it for training) is refused up front.
        defjvp_full(prim, jvp)

    def vjp(backend: Backend, upstream: Any, node: Any) -> tuple[Any, ...]:
        return _backward(node.params["op"], upstream, node.inputs, node.output, node.parents,
                         node.in_shapes)

    if _defines(cls, "backward"):  # without it, reverse mode meets the JVP rule's error
        defvjp(prim, vjp)
    return prim, linear


def _backward(op: CustomOp, upstream: Any, inputs: tuple[Any, ...] | None, output: Any,
              active: tuple[Any, ...], shapes: tuple[Any, ...]) -> tuple[Any, ...]:
    """The op's backward, checked. `active` has one entry per input, falsy for an input
    that needs no gradient (or the input's node, whose leaves name it in errors);
    `shapes` gives each input's shape (or an object with one) where it was not saved."""
    name = type(op).__name__
    if not _defines(op, "backward"):
        raise DerivativeError(f"{name} has no backward(): it is inference-only, so it cannot "
                              "be differentiated in reverse mode")
    if inputs is None:  # not saved (the op's `saves`)
        inputs = (None,) * len(active)
    grads = op.backward(upstream, _arrays(inputs), _array(output))
    if not isinstance(grads, (tuple, list)) or len(grads) != len(inputs):
        raise KernelError(name, inputs, f"backward must return a tuple of {len(inputs)} "
                          "gradients (None where an input has none)")
    for i, (g, needed) in enumerate(zip(grads, active)):
        if g is None and needed is not None and needed is not False:
            # Rule 8: None here would silently leave the parameters above it untrained.
            raise DerivativeError(
                f"{name}.backward returned None for input {i}{_operand(inputs, i)}, which "
                f"lies on the path from {_parameters(needed)} to the loss; return its "
                "gradient, or detach that input if it must not be trained")
    return tuple(None if g is None else _checked(
        name, f"backward (input {i})", g, inputs[i] if inputs[i] is not None else shapes[i])
        for i, g in enumerate(grads))


def _operand(inputs: tuple[Any, ...] | None, i: int) -> str:
    value = inputs[i] if inputs is not None else None
    return f" ({value.shape} {value.dtype})" if isinstance(value, np.ndarray) else ""


def _parameters(node: Any) -> str:
    """The trainable tensors an input depends on, by name where they have one."""
    if not hasattr(node, "parents") or node is True:
        return "a parameter"  # a plan's variable, or a linearized tangent: no leaves to name
    names = [f"parameter {leaf.name} {leaf.shape}" if leaf.name else f"a tensor {leaf.shape}"
             for leaf in leaves_above(node)]
    return ", ".join(names[:3]) + (" and others" if len(names) > 3 else "") or "a parameter"


def _checked(name: str, where: str, value: Any, like: Any) -> np.ndarray:
    """`value` as an array shaped (and typed, where `like` says) like `like`: an array,
    a shape tuple, or an object with `shape` (and `dtype`)."""
    value = np.asarray(value)
    shape = like if type(like) is tuple else getattr(like, "shape", None)
    if shape is None:
        shape = np.shape(like)
    if value.shape != shape or value.dtype != getattr(like, "dtype", value.dtype):
        operands = (value, like) if isinstance(like, np.ndarray) else (value,)
        raise KernelError(name, operands, f"{where} returned shape {value.shape} "
                          f"{value.dtype} for an operand of shape {shape} "
                          f"{getattr(like, 'dtype', '')}")
    return value


def _array(value: Any) -> Any:
    return getattr(value, "_data", value)


def _arrays(values: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(_array(v) for v in values)
