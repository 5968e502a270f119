"""`OnnxModel`: a loaded ONNX graph, callable on NumPy arrays or tensors; an `nn.Module`.

Each input signature (shapes and dtypes) gets its own inference plan
(`pb.compile`), traced on the first call with that signature, whose outputs
are that call's result. A graph that cannot be one static plan runs eagerly
under `no_grad` instead, for every call with that signature: one whose shapes
depend on input values (an Expand to a shape given as an input), or one with
string or sequence inputs, or a `Gradient` node. `model.mode(*inputs)` says
which, and why.

When something must be differentiated (a trainable parameter or an input that
requires grad, with grad enabled) or traced (inside `pb.compile`, `pb.grad`...),
a call runs the graph's nodes op by op on tensors instead, recorded like any
module's forward: that is how a model loaded with `trainable=True` trains,
eagerly or through a TRAINING plan.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from ..ad import Leaf, current_evaluator
from ..lower import Plan
from ..lower import compile as compile_plan
from ..nn import Module, Parameter
from ..nn.module import GraphTrace
from ..ops.hints import TensorLike
from ..tensor import Tensor, enable_grad, is_grad_enabled, no_grad
from ..tensor.eager import evaluate, wrap
from .errors import OnnxImportError
from .interpreter import RunContext, check_size, last_uses, run_graph
from .loader import GraphSpec, ValueSpec
from .registry import DataDependentError
from .trainable import choose_trainable, frozen_reasons

_MAX_PLANS = 16  # plans kept per model (least recently used dropped)

# What a call gives per graph output: a Tensor for a numeric tensor, a NumPy array of
# str for a string tensor, a list for a sequence.
OnnxOutput = Tensor | NDArray[Any] | list["OnnxOutput"]


class OnnxModel(Module):
    """`model(*inputs)` returns a tuple with one entry per graph output: a Tensor for a
    numeric tensor, a NumPy array of str for a string tensor, a list for a sequence.

    Loaded with `trainable=...`, the chosen initializers are its parameters
    (`named_parameters()` gives them under their ONNX names) and it trains as any
    module does; `trainable_initializers()` says which could be and why not."""

    def __init__(self, spec: GraphSpec, max_tensor_bytes: int,
                 trainable: bool | Iterable[str] = False) -> None:
        super().__init__()
        self.spec = spec
        self.max_tensor_bytes = max_tensor_bytes
        self._runners: OrderedDict[tuple[object, ...], _PlanRunner | _EagerRunner] = \
            OrderedDict()
        self._frees = last_uses(spec)
        for name in choose_trainable(spec, trainable):
            # A copy: the parameter is trained in place, the spec keeps the file's values.
            self._parameters[name] = Parameter(np.array(spec.initializers[name]), name)

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.spec.inputs]

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.spec.outputs]

    @property
    def opsets(self) -> dict[str, int]:
        return dict(self.spec.opsets)

    def __repr__(self) -> str:
        ins = ", ".join(_describe_spec(v) for v in self.spec.inputs)
        outs = ", ".join(_describe_spec(v) for v in self.spec.outputs)
        trained = f", {len(self._parameters)} trainable" if self._parameters else ""
        return f"OnnxModel({self.spec.name or 'graph'}: ({ins}) -> ({outs}), " \
               f"{len(self.spec.nodes)} nodes{trained})"

    def trainable_initializers(self) -> dict[str, str]:
        """Every initializer: "trainable" (it may be a parameter), or why it stays constant
        (not floating point; a shape, axes, pads or other value a plan is built with;
        BatchNormalization's running statistics)."""
        reasons = frozen_reasons(self.spec)
        return {name: reasons.get(name, "trainable") for name in self.spec.initializers}

    # ------------------------------------------------------------ calling

    def __call__(self, *inputs: TensorLike) -> tuple[OnnxOutput, ...]:
        if self._records(inputs):
            return self.forward(*inputs)
        arrays = self._prepare(inputs)
        key = _signature(arrays)
        runner = self._runners.get(key)
        if runner is not None:
            self._runners.move_to_end(key)
            return runner(arrays)
        runner, outputs = self._build(arrays)
        self._runners[key] = runner
        if len(self._runners) > _MAX_PLANS:
            self._runners.popitem(last=False)
        return outputs

    def forward(self, *inputs: TensorLike) -> tuple[OnnxOutput, ...]:
        """The graph's nodes run op by op on tensors, recorded for autodiff (or traced,
        inside `pb.compile`): the outputs carry gradients to the inputs and parameters."""
        return self.call_with({}, *inputs)

    def call_with(self, parameters: Mapping[str, TensorLike], *inputs: TensorLike
                  ) -> tuple[OnnxOutput, ...]:
        """`forward` with the given tensors in place of the named parameters (the rest as
        they are), as `torch.func.functional_call`: e.g. `pb.gradcheck(lambda w:
        model.call_with({"w": w}, x)[0], (w0,))` checks gradients with respect to `w`."""
        unknown = sorted(set(parameters) - set(self._parameters))
        if unknown:
            raise KeyError(f"call_with: {', '.join(map(repr, unknown))} "
                           f"{'is not a parameter' if len(unknown) == 1 else 'are not parameters'}"
                           f" of this model (its parameters: "
                           f"{', '.join(self._parameters) or 'none; load with trainable=True'})")
        traced = current_evaluator() is not evaluate
        if traced and self.spec.eager_reason is not None:
            raise OnnxImportError(f"this graph cannot be traced into a plan "
                                  f"({self.spec.eager_reason}); call it eagerly")
        values = [_recorded_input(x, v) for x, v in zip(self._check_count(inputs),
                                                        self.spec.inputs)]
        _check_symbolic_dims(values, self.spec.inputs)
        self._check_sizes(values)
        env = self._env(values)
        for name, value in parameters.items():
            env[name] = _as_parameter_value(name, value, self.spec.initializers[name])
        try:
            outs = self._run(env, eager=not traced)
        except DataDependentError as err:
            raise OnnxImportError(f"this graph's shapes depend on input values ({err}), so it "
                                  "cannot be traced into a plan; call it eagerly") from None
        return self._finish(outs)

    def traced_forward(self, x: TensorLike) -> tuple[Tensor, GraphTrace]:
        """`(output, trace)` for a graph of one input and one output, for the explicit
        path: `model.backprop(trace, grad_output)`, then `model.update(applyer, grads)`."""
        if len(self.spec.inputs) != 1 or len(self.spec.outputs) != 1:
            raise TypeError(f"traced_forward: this graph has {len(self.spec.inputs)} inputs and "
                            f"{len(self.spec.outputs)} outputs, not one of each; call the model "
                            "and use loss.backward() instead")
        data = x.numpy() if isinstance(x, Tensor) else np.asarray(x)
        traced = wrap(data, None)
        if data.dtype.kind == "f":
            traced._node = Leaf(data.shape, data.dtype, None, "input")
        with enable_grad():
            (out,) = self.forward(traced)
        y = cast(Tensor, out)  # a graph of one tensor output gives a Tensor
        return y, GraphTrace(self, traced if data.dtype.kind == "f" else None, y)

    def _records(self, inputs: Sequence[Any]) -> bool:
        """Whether this call must record (or be traced) rather than run a plan."""
        if current_evaluator() is not evaluate:
            return True  # traced (pb.compile, transforms): the plan would hide the ops
        if not is_grad_enabled():
            return False
        return bool(self._parameters) or any(
            isinstance(x, Tensor) and x.requires_grad for x in inputs)

    def _check_count(self, inputs: Sequence[Any]) -> Sequence[Any]:
        specs = self.spec.inputs
        if len(inputs) != len(specs):
            names = ", ".join(v.name for v in specs)
            raise TypeError(f"the model takes {len(specs)} input{'s' if len(specs) != 1 else ''}"
                            f" ({names}), got {len(inputs)}")
        return inputs

    def mode(self, *inputs: TensorLike) -> str:
        """"plan" or "eager: <reason>" for these inputs' signature (after a call with them)."""
        runner = self._runners.get(_signature(self._prepare(inputs)))
        if runner is None:
            return "not built yet (call the model with these inputs first)"
        return runner.mode

    def _prepare(self, inputs: Sequence[Any]) -> list[Any]:
        specs = self.spec.inputs
        arrays = [_as_input(x, v) for x, v in zip(self._check_count(inputs), specs)]
        _check_symbolic_dims(arrays, specs)
        self._check_sizes(arrays)
        return arrays

    def _check_sizes(self, values: Sequence[Any]) -> None:
        """An input over the memory budget is refused: the graph would compute with it."""
        for value, spec in zip(values, self.spec.inputs):
            for item in value if isinstance(value, list) else [value]:
                check_size(item.shape, item.dtype, self.max_tensor_bytes, f"input {spec.name!r}")

    def _run(self, env: dict[str, Any], eager: bool) -> list[Any]:
        run = RunContext(eager=eager, max_tensor_bytes=self.max_tensor_bytes, spec=self.spec)
        env = run_graph(self.spec, env, run, self._frees)
        return [env[v.name] for v in self.spec.outputs]

    def _env(self, values: Sequence[Any]) -> dict[str, Any]:
        env: dict[str, Any] = dict(self.spec.initializers)
        env.update(self._parameters)  # trainable initializers: tensors, read at each call
        env.update(zip(self.input_names, values))
        return env

    def _build(self, arrays: list[Any]
               ) -> tuple[_PlanRunner | _EagerRunner, tuple[OnnxOutput, ...]]:
        runner: _PlanRunner | _EagerRunner
        if self.spec.eager_reason is not None:
            runner = _EagerRunner(self, self.spec.eager_reason)
            return runner, runner(arrays)
        captured: list[Any] = []

        def traced(*tensors: Tensor) -> tuple[Tensor, ...]:
            outs = self._run(self._env(tensors), eager=False)
            captured.extend(outs)
            return tuple(_dynamic_leaves(outs))

        try:
            plan = compile_plan(traced, *arrays)
        except DataDependentError as err:
            runner = _EagerRunner(self, f"shapes depend on input values ({err})")
            return runner, runner(arrays)
        runner = _PlanRunner(self, plan, captured)
        return runner, self._finish(captured)

    def _finish(self, outs: list[Any]) -> tuple[OnnxOutput, ...]:
        """Outputs as returned to the caller, checked against the declared dtypes."""
        result = []
        for value, spec in zip(outs, self.spec.outputs):
            value = _public(value)
            dtype = getattr(value, "dtype", None)
            if spec.kind == "tensor" and spec.dtype is not None and dtype is not None \
                    and np.dtype(dtype) != spec.dtype:
                raise OnnxImportError(f"output {spec.name!r}: computed {np.dtype(dtype)} but the "
                                      f"graph declares {spec.dtype} (a converter bug)")
            result.append(value)
        return tuple(result)


class _PlanRunner:
    """Calls one inference plan; static outputs (known without the inputs) are stored."""

    mode = "plan"

    def __init__(self, model: OnnxModel, plan: Plan, traced_outs: list[Any]):
        self.model = model
        self.plan = plan
        # The outputs' structure, with static values kept and dynamic ones to be filled.
        self.template = [_freeze(o) for o in traced_outs]

    def __call__(self, arrays: list[Any]) -> tuple[OnnxOutput, ...]:
        results = self.plan(*arrays)
        fresh = iter(results if isinstance(results, tuple) else (results,))
        return self.model._finish([_fill(t, fresh) for t in self.template])


class _EagerRunner:
    def __init__(self, model: OnnxModel, reason: str):
        self.model = model
        self.mode = f"eager: {reason}"

    def __call__(self, arrays: list[Any]) -> tuple[OnnxOutput, ...]:
        values = [_as_tensor(a) for a in arrays]
        with no_grad():
            outs = self.model._run(self.model._env(values), eager=True)
        return self.model._finish(outs)


# ---------------------------------------------------------------- helpers

_DYNAMIC = object()


def _dynamic_leaves(outs: Sequence[Any]) -> list[Tensor]:
    leaves: list[Tensor] = []
    for o in outs:
        if isinstance(o, list):
            leaves.extend(_dynamic_leaves(o))
        elif isinstance(o, Tensor):
            leaves.append(o)
    return leaves


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return [_freeze(v) for v in value]
    return _DYNAMIC if isinstance(value, Tensor) else value


def _fill(template: Any, fresh: Any) -> Any:
    if isinstance(template, list):
        return [_fill(t, fresh) for t in template]
    if template is _DYNAMIC:
        return next(fresh)
    return template.copy()  # a static output: a copy, so callers cannot change the plan's


def _public(value: Any) -> Any:
    if isinstance(value, list):
        return [_public(v) for v in value]
    if isinstance(value, np.ndarray) and value.dtype.kind not in "OUS":
        return wrap(np.array(value), None)  # a fresh copy, so callers cannot change ours
    return value


def _as_tensor(value: Any) -> Any:
    # A copy (as pb.tensor makes), so no view of the caller's array can change a value a
    # recorded backward saved; wrapped directly, in whatever dtype the graph declares.
    if isinstance(value, np.ndarray) and value.dtype.kind not in "OUS":
        return wrap(np.array(value), None)
    if isinstance(value, list):
        return [_as_tensor(v) for v in value]
    return value


def _signature(arrays: Sequence[Any]) -> tuple[object, ...]:
    sig: list[object] = []
    for a in arrays:
        if isinstance(a, list):
            sig.append(("seq",) + _signature(a))
        else:
            sig.append((a.shape, a.dtype.str))
    return tuple(sig)


def _describe_spec(v: ValueSpec) -> str:
    if v.kind != "tensor":
        return f"{v.name}: {v.kind}"
    shape = "?" if v.shape is None else "(" + ", ".join(str(d) for d in v.shape) + ")"
    return f"{v.name}: {shape} {v.dtype}"


def _as_input(x: Any, spec: ValueSpec) -> Any:
    """An input as a NumPy array (a list of them for a sequence), checked against the
    graph's declaration."""
    if spec.kind == "sequence":
        if not isinstance(x, (list, tuple)):
            raise TypeError(f"input {spec.name!r} is a sequence: pass a list of arrays")
        return [np.asarray(v._data if isinstance(v, Tensor) else v) for v in x]
    if isinstance(x, Tensor):
        array = x._data  # the checks read it: not `numpy()`, refused while tracing
    elif isinstance(x, np.ndarray):
        array = x
    else:
        array = np.asarray(x, dtype=spec.dtype if spec.dtype is not None else None)
    if spec.dtype is not None and array.dtype != spec.dtype and not (
            spec.dtype.kind == "O" and array.dtype.kind in "OUS"):
        raise OnnxImportError(f"input {spec.name!r}: the graph declares {spec.dtype}, got an "
                              f"array of {array.dtype} (shape {array.shape})")
    if spec.dtype is not None and spec.dtype.kind == "O" and array.dtype.kind != "O":
        array = array.astype(object)
    if spec.shape is not None and (len(spec.shape) != array.ndim or any(
            isinstance(d, int) and d > 0 and d != n for d, n in zip(spec.shape, array.shape))):
        declared = tuple(d if isinstance(d, int) and d > 0 else (d or "?") for d in spec.shape)
        raise OnnxImportError(f"input {spec.name!r}: the graph declares shape {declared}, got "
                              f"{array.shape} {array.dtype}")
    return array


def _recorded_input(x: Any, spec: ValueSpec) -> Any:
    """An input for the recorded path: a tensor stays itself (its graph and its trace
    identity matter), checked against the declaration like any input."""
    if isinstance(x, Tensor):
        _as_input(x, spec)  # the checks only
        return x
    return _as_tensor(_as_input(x, spec))


def _as_parameter_value(name: str, value: Any, initializer: np.ndarray) -> Any:
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or tuple(shape) != initializer.shape or np.dtype(dtype) != initializer.dtype:
        raise OnnxImportError(f"call_with: parameter {name!r} is {initializer.shape} "
                              f"{initializer.dtype}; got "
                              f"{tuple(shape) if shape is not None else type(value).__name__}"
                              f"{' ' + str(np.dtype(dtype)) if dtype is not None else ''}")
    return value if isinstance(value, Tensor) else _as_tensor(np.asarray(value))


def _check_symbolic_dims(arrays: Sequence[Any], specs: Sequence[ValueSpec]) -> None:
    """A named dimension ("batch") must have one size across all inputs."""
    sizes: dict[str, tuple[int, str]] = {}
    for array, spec in zip(arrays, specs):
        if spec.shape is None or isinstance(array, list):
            continue
        for d, n in zip(spec.shape, array.shape):
            if isinstance(d, str):
                seen = sizes.setdefault(d, (n, spec.name))
                if seen[0] != n:
                    raise OnnxImportError(f"inputs {seen[1]!r} and {spec.name!r}: dimension "
                                          f"{d!r} is {seen[0]} in one and {n} in the other")
