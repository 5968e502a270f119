"""Static graphs: a function traced once into equations over variables.

Tracing installs an evaluator that records every primitive application while
still computing it on the example inputs, so shapes and dtypes are known. A
tensor that is an input becomes an input variable, a tensor that requires
grad and is not computed from others (a parameter) becomes a parameter
variable read at each call, and anything else is a constant baked into the
graph. An in-place write into a tensor that is not a traced value (a module's
buffer: BatchNorm's running statistics) is recorded as state: the written value
becomes an extra result of the graph, which plans write back into the tensor's
array after every call, and later reads in the trace see the written value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ad import Primitive, set_evaluator
from ..errors import TracingError, user_frame
from ..ops.elementwise import astype
from ..ops.shape import broadcast_to, stop_gradient_p
from ..tensor import Tensor, no_grad
from ..tensor.concrete import reset_concrete_check, set_concrete_check
from ..tensor.eager import evaluate, wrap

if TYPE_CHECKING:
    from ..ops.hints import DTypeLike, Shape


class LoweringError(ValueError):
    """A graph that cannot be lowered as asked."""


@dataclass(eq=False)
class Var:
    """A value in a static graph."""

    index: int
    shape: Shape
    dtype: np.dtype[Any]
    kind: str  # "input", "param", "const" or "value"
    producer: Eqn | None = None  # the equation that computes it ("value" only)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"v{self.index}"


@dataclass(eq=False)
class Eqn:
    primitive: Primitive
    args: tuple[Any, ...]  # Var or a Python scalar
    params: dict[str, Any]  # may hold Vars (in tuples too): values computed from the inputs
    out: Var

    @property
    def param_vars(self) -> tuple[Var, ...]:
        """The Vars among the parameters, read at each call like operands."""
        found: list[Var] = []
        stack = list(self.params.values())
        while stack:
            v = stack.pop()
            if isinstance(v, Var):
                found.append(v)
            elif isinstance(v, (tuple, list)):
                stack.extend(v)
        return tuple(found)


def resolve_params(params: dict[str, Any], env: Sequence[Any] | Mapping[int, Any]
                   ) -> dict[str, Any]:
    """The parameters with each Var replaced by its value in `env` (by the Var's index)."""

    def one(v: Any) -> Any:
        if isinstance(v, Var):
            return env[v.index]
        if isinstance(v, (tuple, list)):
            return type(v)(one(x) for x in v)
        return v

    return {k: one(v) for k, v in params.items()}


@dataclass(eq=False)
class StaticGraph:
    inputs: list[Var] = field(default_factory=list)
    params: list[tuple[Var, Tensor]] = field(default_factory=list)
    consts: list[tuple[Var, np.ndarray]] = field(default_factory=list)
    eqns: list[Eqn] = field(default_factory=list)
    outputs: list[Var] = field(default_factory=list)
    vars: list[Var] = field(default_factory=list)
    #: (tensor, var its values were read as at the start or None, var of the values
    #: written into it last): what plans write back into the tensor after each call.
    state: list[tuple[Tensor, Var | None, Var]] = field(default_factory=list)
    #: The constants read from a tensor (a module's buffer) rather than given as arrays:
    #: their values may be overwritten in place between calls, so a plan reads them at
    #: each call and computes nothing from them once for all (fold.py).
    tensor_consts: set[int] = field(default_factory=set)
    #: The constants lowering computed (fold.py) from other constants: arrays only the
    #: plan holds, which nothing changes once lowered (a caller's arrays may be changed
    #: in place, and the plan then reads the new values).
    computed_consts: set[int] = field(default_factory=set)

    def new_var(self, shape: Sequence[int], dtype: DTypeLike, kind: str) -> Var:
        var = Var(len(self.vars), tuple(shape), np.dtype(dtype), kind)
        self.vars.append(var)
        return var

    def readers(self) -> dict[int, list[Eqn]]:
        """Per value (by index), the equations that read it, as an operand or a
        parameter, in order (once per read)."""
        found: dict[int, list[Eqn]] = {}
        for eqn in self.eqns:
            for a in eqn.args + eqn.param_vars:
                if isinstance(a, Var):
                    found.setdefault(a.index, []).append(eqn)
        return found


class _Tracer:
    """The evaluator installed while tracing: computes, and records each equation.

    A tensor is known by its identity, not by its array: a detached tensor shares its
    source's array but is another tensor, one that carries no gradient. Arrays are
    remembered separately (`source_of`), to find the value an alias (a detached tensor,
    an unwrapped array) reads."""

    def __init__(self, graph: StaticGraph):
        self.graph = graph
        self.var_of: dict[int, Var] = {}  # id(tensor, or array operand) -> its var
        self.source_of: dict[int, Var] = {}  # id(array) -> the var whose values it holds
        self.alive: list[Any] = []  # keeps traced objects alive so their ids stay unique
        # The vars whose values change from call to call: computed from an input or a
        # parameter. Reading one concretely would bake it (`refuse_concrete`).
        self.traced: set[int] = set()

    def bind_input(self, tensor: Tensor) -> None:
        var = self.graph.new_var(tensor.shape, tensor.dtype, "input")
        self.graph.inputs.append(var)
        self.traced.add(var.index)
        self._remember(tensor, var)

    def refuse_concrete(self, tensor: Any, operation: str) -> None:
        """The check installed for `float(t)`, `t.item()`, `np.asarray(t)` and the like:
        refuses a traced value (or a parameter, which the plan reads anew at each call),
        naming the user's line. Constants (tensors made or closed over, not computed from
        the inputs) stay readable."""
        var = self.var_of.get(id(tensor))
        if var is None:
            var = self.source_of.get(id(tensor._data))
        if var is not None:
            traced = var.index in self.traced
        else:
            traced = tensor.requires_grad and tensor.is_leaf  # a parameter not read yet
        if traced:
            raise TracingError(operation, tensor, user_frame(2))

    def _remember(self, obj: Any, var: Var) -> None:
        self.var_of[id(obj)] = var
        self.alive.append(obj)
        if isinstance(obj, Tensor):
            # Code that unwraps a tensor (labels turned into an array) still reaches its var.
            self.source_of[id(obj._data)] = var
            self.alive.append(obj._data)

    def _alias(self, source: Var) -> Var:
        """A var with `source`'s values and no gradient (what `detach` gives eagerly)."""
        if source.kind in ("const", "input"):
            return source  # no gradient to cut
        var = self.graph.new_var(source.shape, source.dtype, "value")
        if source.index in self.traced:
            self.traced.add(var.index)
        var.producer = Eqn(stop_gradient_p, (source,), {}, var)
        self.graph.eqns.append(var.producer)
        return var

    def _param(self, tensor: Tensor) -> Var:
        var = self.graph.new_var(tensor.shape, tensor.dtype, "param")
        self.graph.params.append((var, tensor))
        self.traced.add(var.index)
        seen = self.source_of.get(id(tensor._data))
        if seen is not None and seen.kind == "const":
            # An alias of this parameter (x.detach()) was read before the parameter and
            # taken for a constant: it reads the parameter at each call, without gradient.
            self.graph.consts = [(v, d) for v, d in self.graph.consts if v is not seen]
            seen.kind = "value"
            self.traced.add(seen.index)
            seen.producer = Eqn(stop_gradient_p, (var,), {}, seen)
            self.graph.eqns.insert(0, seen.producer)  # a parameter is there from the start
        self._remember(tensor, var)
        return var

    def operand(self, arg: Any) -> Any:
        if isinstance(arg, (bool, int, float)) or arg is None:
            return arg
        var = self.var_of.get(id(arg))
        if var is not None:
            return var
        if isinstance(arg, Tensor) and arg.requires_grad and arg.is_leaf:
            return self._param(arg)
        data = arg._data if isinstance(arg, Tensor) else arg
        source = self.source_of.get(id(data))
        if source is not None:
            # An alias of a traced value: the same values, cut from the gradient.
            var = self._alias(source)
            self.var_of[id(arg)] = var
            self.alive.append(arg)
            return var
        data = np.asarray(data)
        var = self.graph.new_var(data.shape, data.dtype, "const")
        self.graph.consts.append((var, data))
        if isinstance(arg, Tensor):
            self.graph.tensor_consts.add(var.index)
        self._remember(arg, var)
        if not isinstance(arg, Tensor):
            self.source_of[id(arg)] = var  # an array read before the tensor that holds it
        return var

    def traced_param(self, value: Any) -> Any:
        """A parameter value with every array computed from the inputs (a `where`
        condition, an index) replaced by its Var, so that plans read it anew at each
        call; other arrays are constants of the graph, baked in."""
        if isinstance(value, (tuple, list)):
            items = [self.traced_param(v) for v in value]
            if any(isinstance(v, (Var, tuple, list)) and v is not w for v, w in zip(items, value)):
                return type(value)(items)
            return value
        if isinstance(value, (np.ndarray, Tensor)):
            var = self.var_of.get(id(value))
            if var is None:
                var = self.source_of.get(id(value._data if isinstance(value, Tensor) else value))
            if var is not None and var.kind != "const":
                return var
        return value

    def write_state(self, target: Tensor, op: str, value: Any) -> Tensor:
        """`target`'s values replaced by `value` (a tensor, array or number), in place, as
        state of the graph: recorded, not done, so that tracing changes nothing and the
        plan repeats the write at every call. Only tensors that are not traced values
        (buffers) take writes: a traced value's in-place op has no tensor to write to."""
        known = self.var_of.get(id(target))
        written = any(t is target for t, _, _ in self.graph.state)
        if (target.requires_grad and target.is_leaf) or (
                known is not None and known.kind != "const" and not written):
            raise RuntimeError(f"{op}: in-place ops cannot be traced or compiled on traced "
                               "values or parameters (only on buffers); write x = x + y "
                               "instead")
        if not isinstance(value, Tensor):
            value = wrap(np.full(target.shape, value, target.dtype) if np.ndim(value) == 0
                         else np.asarray(value), None)
        if value.dtype != target.dtype:
            value = astype(value, target.dtype)
        if value.shape != target.shape:
            value = broadcast_to(value, target.shape)
        new = self.operand(value)
        for i, (t, start, _) in enumerate(self.graph.state):
            if t is target:
                self.graph.state[i] = (t, start, new)
                break
        else:
            start = known if known is not None and known.kind == "const" else None
            self.graph.state.append((target, start, new))
        self.var_of[id(target)] = new  # later reads in the trace see the written value
        return target

    def __call__(self, prim: Primitive, args: tuple, params: dict) -> Tensor:
        operands = tuple(self.operand(a) for a in args)
        with no_grad():
            out = evaluate(prim, args, params)
        var = self.graph.new_var(out.shape, out.dtype, "value")
        traced = {k: self.traced_param(v) for k, v in params.items()}
        if any(traced[k] is not params[k] for k in params):
            params = traced
            masks = [v for v in Eqn(prim, operands, params, var).param_vars
                     if v.dtype == np.bool_ and not prim.masks_keep_shape]
            if masks:
                raise LoweringError(
                    f"compile: {prim.name} takes a boolean mask computed from the inputs "
                    f"({masks[0].shape} bool), so its result's shape depends on their values; "
                    "a plan needs static shapes (use where(), or run this part eagerly)")
        eqn = Eqn(prim, operands, params, var)
        if any(isinstance(a, Var) and a.index in self.traced
               for a in operands + eqn.param_vars):
            self.traced.add(var.index)
        var.producer = eqn
        self.graph.eqns.append(eqn)
        self._remember(out, var)
        return out


def trace(fn: Callable[..., object], example_inputs: tuple[object, ...]
          ) -> tuple[StaticGraph, bool]:
    """Run `fn` once on the examples, recording a static graph; returns it and whether
    `fn` returned one tensor (else a tuple of them)."""
    graph = StaticGraph()
    tracer = _Tracer(graph)
    args: list[object] = []
    for x in example_inputs:
        if isinstance(x, (Tensor, np.ndarray)):
            t = wrap(np.asarray(x._data if isinstance(x, Tensor) else x), None)
            tracer.bind_input(t)
            args.append(t)
        else:
            args.append(x)  # a module or another static argument
    previous = set_evaluator(tracer)
    token = set_concrete_check(tracer.refuse_concrete)
    try:
        out: Any = fn(*args)  # checked below
    finally:
        reset_concrete_check(token)
        set_evaluator(previous)
    single = isinstance(out, Tensor)
    outs = (out,) if single else tuple(out)
    for o in outs:
        if not isinstance(o, Tensor):
            raise TypeError(f"compile: the function must return tensors, got {type(o).__name__}")
        graph.outputs.append(tracer.operand(o))
    return graph, single
