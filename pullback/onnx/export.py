"""`export(module, example_input, path)`: a pullback model written as an ONNX file.

The model is traced once on the example with the static-graph tracer
(`pullback.lower.trace`, what `pb.compile` uses), in eval mode (Dropout is the
identity), and each recorded primitive becomes ONNX nodes through the exporter
registered on it (exporters.py): primitives, not layers, so any model composed of
pullback ops exports, whatever its layers. Parameters, buffers and constants become
initializers (parameters under their `named_parameters()` names). The graph has
the example's shapes (no symbolic batch dimension), opset 17. A primitive
without an ONNX mapping is an `ExportError` listing every such primitive at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from ..lower import trace
from ..lower.graph import StaticGraph, Var
from ..nn import Module
from ..tensor import Tensor
from .exporters import Context, Emitter, ExportError, describe_unexported, exporter_of
from .loader import import_onnx

if TYPE_CHECKING:
    from onnx import ModelProto  # no type information: Any to mypy

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17: what onnxruntime expects

# What export traces: a module, or a function of tensors returning one or several.
Exportable = Module | Callable[..., Tensor | tuple[Tensor, ...]]
# The example inputs it traces on: a tensor or array, or a tuple (or list) of them.
ExampleInput = Tensor | NDArray[Any] | Sequence[Tensor | NDArray[Any]]


# ---------------------------------------------------------------- export


def _modules(module: object) -> list[Module]:
    found: list[Module] = []
    stack = [module] if isinstance(module, Module) else []
    while stack:
        m = stack.pop()
        found.append(m)
        stack.extend(child for _, child in m.named_children())
    return found


def _as_examples(example_input: object) -> tuple[NDArray[Any], ...]:
    examples = example_input if isinstance(example_input, (tuple, list)) else (example_input,)
    arrays = []
    for i, x in enumerate(examples):
        if isinstance(x, Tensor):
            arrays.append(x.numpy())
        elif isinstance(x, np.ndarray):
            arrays.append(x)
        else:
            raise TypeError(f"export: example input {i} must be a Tensor or a NumPy array, not "
                            f"{type(x).__name__}")
    return tuple(arrays)


def to_model(module: Exportable, example_input: ExampleInput) -> ModelProto:
    """The ONNX ModelProto of `module` (an nn.Module or a function of tensors) traced on
    `example_input` (a tensor or array, or a tuple of them): what `export` writes."""
    onnx = import_onnx()
    if not callable(module):
        raise TypeError(f"export: expected a module or a function, got {type(module).__name__}")
    examples = _as_examples(example_input)
    modes = [(m, m.training) for m in _modules(module)]
    for m, _ in modes:
        object.__setattr__(m, "training", False)  # eval: Dropout is the identity
    try:
        graph, _ = trace(module, examples)
    finally:
        for m, mode in modes:
            object.__setattr__(m, "training", mode)
    return _build(onnx, graph, module, type(module).__name__)


def _build(onnx: Any, graph: StaticGraph, module: object, name: str) -> ModelProto:
    missing: dict[str, str] = {}
    for eqn in graph.eqns:
        if exporter_of(eqn) is None:
            missing.setdefault(eqn.primitive.name, describe_unexported(eqn))
    if missing:
        raise ExportError(f"export: {len(missing)} primitive{'s' if len(missing) != 1 else ''} "
                          f"of {name} cannot be written as ONNX:\n  " +
                          "\n  ".join(missing.values()))
    emit = Emitter()
    helper = emit.helper
    names: dict[int, str] = {}
    inputs = []
    for i, var in enumerate(graph.inputs):
        names[var.index] = emit.fresh("input" if len(graph.inputs) == 1 else f"input_{i}")
        inputs.append(_value_info(helper, names[var.index], var))
    param_names = {id(p): n for n, p in module.named_parameters()} \
        if isinstance(module, Module) else {}
    buffer_names = {id(b._data): n for n, b in module.named_buffers()} \
        if isinstance(module, Module) else {}
    for var, tensor in graph.params:
        names[var.index] = emit.const(tensor.numpy(), param_names.get(id(tensor), "param"))
    for var, data in graph.consts:
        names[var.index] = emit.const(data, buffer_names.get(id(data), "const"))
    for eqn in graph.eqns:
        write = exporter_of(eqn)
        assert write is not None  # every equation's exporter was found above
        names[eqn.out.index] = write(Context(emit, eqn, names))
    outputs = []
    for i, var in enumerate(graph.outputs):
        out_name = emit.fresh("output" if len(graph.outputs) == 1 else f"output_{i}")
        emit.nodes.append(helper.make_node("Identity", [names[var.index]], [out_name],
                                           name=emit.fresh(f"Identity_{out_name}")))
        outputs.append(_value_info(helper, out_name, var))
    onnx_graph = helper.make_graph(emit.nodes, name, inputs, outputs,
                                   initializer=emit.initializers)
    model = helper.make_model(onnx_graph, producer_name="pullback",
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as err:  # ValidationError, InferenceError: a bug in a table entry
        raise ExportError(f"export: the ONNX file pullback built fails the ONNX checker "
                          f"(a bug in pullback.onnx.export): {err}") from None
    return model


def _value_info(helper: Any, name: str, var: Var) -> Any:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(var.dtype),
                                         list(var.shape))


def export(module: Exportable, example_input: ExampleInput, path: str | os.PathLike[str]
           ) -> ModelProto:
    """Write `module` as an ONNX file at `path`, traced on `example_input` in eval mode;
    returns the ModelProto. Its graph input is named "input" ("input_0", ... for several),
    its output "output"; parameters keep their `named_parameters()` names."""
    model = to_model(module, example_input)
    data = model.SerializeToString()
    target = os.fspath(path)
    partial = f"{target}.partial"
    with open(partial, "wb") as f:
        f.write(data)
    os.replace(partial, target)  # a reader never sees half a file
    return model
