"""The loaded model as a callable: plans per input signature, the eager fallback, inputs
and outputs, errors naming the node, the lazy onnx import."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from graphs import FLOAT, INT64, graph_model, node_model, value_info
from onnx import helper

import pullback as pb
import pullback.onnx
from pullback.onnx.loader import import_onnx


def _mlp_with_batch_dim() -> bytes:
    w = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["y"], name="act")]
    return graph_model(nodes, [helper.make_tensor_value_info("x", FLOAT, ["batch", 4])],
                       [helper.make_tensor_value_info("y", FLOAT, ["batch", 3])], {"w": w})


def test_each_input_signature_gets_its_own_plan():
    model = pullback.onnx.load(_mlp_with_batch_dim())
    for batch in (2, 5, 2):
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        (y,) = model(x)
        assert np.asarray(y).shape == (batch, 3)
        assert model.mode(x) == "plan"
    assert len(model._runners) == 2


def test_model_takes_tensors_and_returns_tensors_numpy_accepts():
    model = pullback.onnx.load(_mlp_with_batch_dim())
    x = np.ones((3, 4), np.float32)
    (from_tensor,) = model(pb.tensor(x))
    (from_array,) = model(x)
    assert isinstance(from_tensor, pb.Tensor)
    np.testing.assert_array_equal(np.asarray(from_tensor), np.asarray(from_array))
    assert np.asarray(from_tensor).dtype == np.float32


def test_shapes_given_as_inputs_run_eagerly_and_say_why():
    model_bytes = node_model("Expand", {"x": np.ones((1, 3, 1), np.float32),
                                        "shape": np.asarray([2, 1, 4], np.int64)})
    model = pullback.onnx.load(model_bytes)
    x = np.arange(3, dtype=np.float32).reshape(1, 3, 1)
    (y,) = model(x, np.asarray([2, 1, 4], np.int64))
    assert np.asarray(y).shape == (2, 3, 4)
    assert model.mode(x, np.asarray([2, 1, 4], np.int64)).startswith("eager: shapes depend")
    (y,) = model(x, np.asarray([3, 1, 1], np.int64))  # same signature, other value: still right
    assert np.asarray(y).shape == (3, 3, 1)


def test_constant_outputs_are_returned_as_copies():
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape")]
    model = pullback.onnx.load(graph_model(
        nodes, [helper.make_tensor_value_info("x", FLOAT, [2, 3])],
        [helper.make_tensor_value_info("s", INT64, [2])]))
    (first,) = model(np.zeros((2, 3), np.float32))
    np.asarray(first)[0] = 99
    (second,) = model(np.zeros((2, 3), np.float32))
    assert np.asarray(second).tolist() == [2, 3]


def test_wrong_input_count_dtype_or_shape_names_the_input():
    model = pullback.onnx.load(_mlp_with_batch_dim())
    with pytest.raises(TypeError, match=r"takes 1 input \(x\), got 2"):
        model(np.ones((2, 4), np.float32), np.ones(1))
    with pytest.raises(pullback.onnx.OnnxImportError, match=r"'x'.*declares float32.*float64"):
        model(np.ones((2, 4)))
    with pytest.raises(pullback.onnx.OnnxImportError, match=r"'x'.*\('batch', 4\).*\(2, 5\)"):
        model(np.ones((2, 5), np.float32))


def test_named_dimensions_must_agree_across_inputs():
    model = pullback.onnx.load(graph_model(
        [helper.make_node("Add", ["a", "b"], ["y"], name="add")],
        [helper.make_tensor_value_info("a", FLOAT, ["n"]),
         helper.make_tensor_value_info("b", FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", FLOAT, ["n"])]))
    with pytest.raises(pullback.onnx.OnnxImportError, match="dimension 'n' is 2 in one and 3"):
        model(np.ones(2, np.float32), np.ones(3, np.float32))


def test_a_failing_node_is_named_with_its_op_shapes_and_dtypes():
    model = pullback.onnx.load(graph_model(
        [helper.make_node("Add", ["a", "b"], ["y"], name="the_add")],
        [helper.make_tensor_value_info("a", FLOAT, ["n", "m"]),
         helper.make_tensor_value_info("b", FLOAT, ["p", "q"])],
        [helper.make_tensor_value_info("y", FLOAT, ["r", "s"])]))
    with pytest.raises(pullback.onnx.NodeError) as err:
        model(np.ones((2, 3), np.float32), np.ones((4, 5), np.float32))
    message = str(err.value)
    assert "Add node 'the_add'" in message
    assert "(2, 3) float32" in message and "(4, 5) float32" in message
    assert "broadcast" in message


def test_missing_onnx_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # what an absent package looks like
    with pytest.raises(ImportError, match=r"pip install 'pullback\[onnx\]'"):
        import_onnx()


def test_importing_pullback_onnx_does_not_import_onnx():
    import subprocess

    code = ("import sys, pullback.onnx; "
            "sys.exit(1 if 'onnx' in sys.modules or 'onnx.defs' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_plan_steps_are_pullback_primitives():
    model = pullback.onnx.load(_mlp_with_batch_dim())
    x = np.ones((2, 4), np.float32)
    model(x)
    text = model._runners[next(iter(model._runners))].plan.explain()
    assert "matmul" in text and "relu" in text


def test_string_inputs_run_eagerly():
    words = np.asarray(["monday", "Tuesday"], dtype=object)
    model_bytes = node_model("StringNormalizer", {"x": words},
                             {"case_change_action": "UPPER", "stopwords": ["monday"]},
                             opset=10)
    model = pullback.onnx.load(model_bytes)
    (out,) = model(words)
    assert out.tolist() == ["TUESDAY"]
    assert model.mode(words).startswith("eager: StringNormalizer")


def test_value_info_helper_builds_typed_inputs():
    info = value_info("x", np.float32, [2])
    assert info.type.tensor_type.elem_type == FLOAT
