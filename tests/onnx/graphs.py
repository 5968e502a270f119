"""Small ONNX models built in code, and onnxruntime as the reference that runs them."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def value_info(name: str, array_or_dtype: Any, shape: Any = None) -> Any:
    if isinstance(array_or_dtype, np.ndarray):
        dtype, shape = array_or_dtype.dtype, array_or_dtype.shape
    else:
        dtype = np.dtype(array_or_dtype)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), shape)


def node_model(op_type: str, inputs: dict[str, np.ndarray], attrs: dict | None = None, *,
               opset: int = 13, constants: dict[str, np.ndarray] | None = None,
               outputs: int = 1, domain: str = "", input_order: list[str] | None = None,
               output_types: list[Any] | None = None) -> bytes:
    """A one-node model: `inputs` are graph inputs, `constants` initializers; the node
    reads them in `input_order` (default: inputs then constants; "" for an omitted one)."""
    constants = constants or {}
    order = input_order if input_order is not None else [*inputs, *constants]
    out_names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op_type, order, out_names, name=f"{op_type.lower()}_node",
                            domain=domain, **(attrs or {}))
    first = next(iter(inputs.values()))
    types = output_types or [first.dtype] * outputs
    out_infos = [value_info(n, np.dtype(t)) for n, t in zip(out_names, types)]
    graph = helper.make_graph(
        [node], "test", [value_info(k, v) for k, v in inputs.items()], out_infos,
        initializer=[numpy_helper.from_array(v, k) for k, v in constants.items()])
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 8
    return _with_output_shapes(model).SerializeToString()


def _with_output_shapes(model: Any) -> Any:
    """The checker wants every graph output typed with a shape: let ONNX infer them."""
    inferred = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v for v in inferred.graph.output} | {
        v.name: v for v in inferred.graph.value_info}
    for out in model.graph.output:
        if out.name in known and known[out.name].type.tensor_type.HasField("shape"):
            out.type.CopyFrom(known[out.name].type)
    return model


def graph_model(nodes: list, inputs: list, outputs: list, initializers: dict | None = None,
                opset: int = 13) -> bytes:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=[
        numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def run_onnxruntime(model: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
__all__ = ["FLOAT", "INT64", "graph_model", "node_model", "onnx", "run_onnxruntime",
           "value_info"]
