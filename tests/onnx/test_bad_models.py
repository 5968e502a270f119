"""Bad models give a clear error, and refusing them takes little memory: truncated or
corrupt files, unknown and unsupported operators (all listed at once), inconsistent
shapes, tensors declared too large for memory."""

from __future__ import annotations

import contextlib
import os
import tracemalloc

import numpy as np
import onnx
import pytest
from conformance import data_dir
from graphs import FLOAT, graph_model, node_model
from onnx import TensorProto, helper

import pullback.onnx
from pullback.onnx import BadModelError, OnnxImportError, UnsupportedOperatorError

RESNET = os.path.join(data_dir(), "light", "light_resnet50.onnx")


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    with contextlib.suppress(OnnxImportError):
        fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.1, 0.3, 0.5, 0.77, 0.9, 0.999])
def test_truncated_file_is_a_clear_error(tmp_path, fraction):
    with open(RESNET, "rb") as f:
        data = f.read()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[:int(len(data) * fraction)])
    with pytest.raises(OnnxImportError) as err:
        pullback.onnx.load(path)
    assert isinstance(err.value, (BadModelError, UnsupportedOperatorError)) or \
        "truncated" in str(err.value)


def test_truncated_file_names_the_likely_cause(tmp_path):
    with open(RESNET, "rb") as f:
        data = f.read()
    with pytest.raises(BadModelError, match="truncated"):
        pullback.onnx.load(data[:len(data) // 2])


def test_garbage_bytes_are_not_a_model():
    with pytest.raises(BadModelError, match="not a valid ONNX model"):
        pullback.onnx.load(b"\xff\xfe this is not protobuf \x00\x01" * 10)


def test_missing_file_and_wrong_type():
    with pytest.raises(FileNotFoundError):
        pullback.onnx.load("/no/such/model.onnx")
    with pytest.raises(TypeError, match="expected a path, bytes or a ModelProto"):
        pullback.onnx.load(42)


def test_unknown_and_unsupported_operators_are_listed_together():
    x = helper.make_tensor_value_info("x", FLOAT, [2, 3])
    nodes = [helper.make_node("FrobnicateAll", ["x"], ["a"], name="mystery"),
             helper.make_node("HardSigmoid", ["a"], ["b"], name="hs"),
             helper.make_node("Relu", ["b"], ["c"], name="fine"),
             helper.make_node("Custom", ["c"], ["y"], domain="com.example", name="custom")]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", FLOAT,
                                                                              [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOperatorError) as err:
        pullback.onnx.load(model.SerializeToString())
    ops = dict(err.value.unsupported)
    assert ops["FrobnicateAll (opset 13)"] == "not an ONNX operator at this opset"
    assert ops["HardSigmoid (opset 13)"] == "not implemented by pullback"
    assert "com.example.Custom (opset 1)" in ops
    assert len(ops) == 3
    assert "3 unsupported operators" in str(err.value)


def test_unimplemented_version_and_attribute_are_reasons():
    # Reshape version 1 took its shape as an attribute; Conv has no attribute "colour".
    x = helper.make_tensor_value_info("x", FLOAT, [2, 3])
    nodes = [helper.make_node("Reshape", ["x"], ["y"], shape=[3, 2])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [x], [helper.make_tensor_value_info("y", FLOAT, [3, 2])]),
        opset_imports=[helper.make_opsetid("", 4)])
    with pytest.raises(UnsupportedOperatorError, match=r"Reshape \(opset 4\): its schema version "
                                                       r"1 is not implemented"):
        pullback.onnx.load(model.SerializeToString())
    conv = node_model("Relu", {"x": np.ones((2, 3), np.float32)}, {"colour": "blue"})
    with pytest.raises(UnsupportedOperatorError, match="attribute colour not implemented"):
        pullback.onnx.load(conv)


def test_inconsistent_shapes_are_refused_at_load():
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")]
    model = graph_model(nodes, [helper.make_tensor_value_info("a", FLOAT, [2, 3]),
                                helper.make_tensor_value_info("b", FLOAT, [4, 5])],
                        [helper.make_tensor_value_info("y", FLOAT, [2, 5])])
    with pytest.raises(BadModelError, match="inconsistent"):
        pullback.onnx.load(model)


def test_output_declared_with_another_shape_is_refused():
    nodes = [helper.make_node("Relu", ["a"], ["y"], name="r")]
    model = graph_model(nodes, [helper.make_tensor_value_info("a", FLOAT, [2, 3])],
                        [helper.make_tensor_value_info("y", FLOAT, [3, 2])])
    with pytest.raises(BadModelError, match="inconsistent"):
        pullback.onnx.load(model)


def _huge_constant_of_shape() -> bytes:
    shape = np.asarray([10**6, 10**6], np.int64)  # 4 TB of float32
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["big"], name="huge"),
             helper.make_node("Add", ["x", "big"], ["y"], name="add")]
    return graph_model(nodes, [helper.make_tensor_value_info("x", FLOAT, [1, 1])],
                       [helper.make_tensor_value_info("y", FLOAT, [10**6, 10**6])], {"s": shape})


def test_constant_of_shape_too_large_is_refused_before_allocating():
    model = pullback.onnx.load(_huge_constant_of_shape())
    x = np.ones((1, 1), np.float32)
    with pytest.raises(OnnxImportError, match=r"ConstantOfShape node 'huge'.*\(1000000, "
                                              r"1000000\) float32.*4,000,000,000,000 bytes"):
        model(x)
    assert _peak_bytes(lambda: model(x)) < 50 * 2**20


def test_expand_and_tile_too_large_are_refused():
    x = np.ones((1, 1), np.float32)
    expand = pullback.onnx.load(node_model("Expand", {"x": x},
                                           constants={"s": np.asarray([10**7, 10**6])}))
    with pytest.raises(OnnxImportError, match=r"Expand node.*over the limit"):
        expand(x)
    tile = pullback.onnx.load(node_model("Tile", {"x": x},
                                         constants={"r": np.asarray([10**7, 10**6])}))
    with pytest.raises(OnnxImportError, match=r"Tile node.*over the limit"):
        tile(x)


def _initializer_model(tensor: TensorProto) -> bytes:
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", FLOAT, ["a", "b"])],
                              initializer=[tensor])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]) \
        .SerializeToString()


def test_initializer_declaring_too_many_elements_is_refused_cheaply():
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[10**6, 10**6],
                         raw_data=b"\x00" * 16)
    data = _initializer_model(tensor)
    with pytest.raises(OnnxImportError, match=r"(name: w\)|'w').*(too small|over the limit)"):
        pullback.onnx.load(data)
    assert _peak_bytes(lambda: pullback.onnx.load(data)) < 50 * 2**20


def test_initializer_whose_data_does_not_fit_its_shape_is_refused():
    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 2],
                         raw_data=np.ones(3, np.float32).tobytes())
    with pytest.raises(OnnxImportError, match=r"(name: w\)|'w').*(too small|holds)"):
        pullback.onnx.load(_initializer_model(tensor))


def test_the_memory_limit_is_a_load_option():
    w = np.ones((64, 64), np.float32)  # 16 KiB
    data = node_model("MatMul", {"x": np.ones((2, 64), np.float32)}, constants={"w": w})
    pullback.onnx.load(data, max_tensor_bytes=1 << 20)
    with pytest.raises(OnnxImportError, match="16,384 bytes, over the limit of 1,000"):
        pullback.onnx.load(data, max_tensor_bytes=1000)


def test_a_valid_model_still_loads_after_all_this():
    assert onnx.load(RESNET) is not None
    assert pullback.onnx.load(RESNET).input_names == ["gpu_0/data_0"]
