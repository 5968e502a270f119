"""Models whose tensors live in external files: read when loaded from the model's path
(initializers and Constant nodes alike), and refused with a `BadModelError` naming the
tensor and the location when the location leaves the model's folder, is a symlink or
a device, or holds a size other than the tensor's. A model importing an opset newer
than pullback implements is refused, naming both opsets."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from graphs import FLOAT, graph_model
from onnx import TensorProto, helper, numpy_helper

import pullback.onnx
from pullback.onnx import BadModelError, OnnxImportError
from pullback.onnx.registry import highest_opset

_W = np.arange(6, dtype=np.float32).reshape(2, 3)


def _external(name: str, array: np.ndarray, location: str) -> TensorProto:
    """A tensor that declares `array`'s shape and type, its data at `location`."""
    tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                         dims=array.shape)
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    return tensor


def _write_model(folder, *, initializer: TensorProto | None = None,
                 constant: TensorProto | None = None) -> str:
    """x (2, 3) + w, w an initializer or a Constant node's value; the model's path."""
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    if constant is not None:
        nodes.insert(0, helper.make_node("Constant", [], ["w"], name="const", value=constant))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", FLOAT, [2, 3])],
                              initializer=[initializer] if initializer is not None else [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    folder.mkdir(exist_ok=True)
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def test_initializer_and_constant_with_external_data_load_from_the_path(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").write_bytes(_W.tobytes())
    x = np.ones((2, 3), np.float32)
    for where in ("initializer", "constant"):
        path = _write_model(folder, **{where: _external("w", _W, "w.bin")})
        (y,) = pullback.onnx.load(path)(x)
        np.testing.assert_array_equal(np.asarray(y), x + _W)


def test_a_model_saved_by_onnx_with_one_data_file_loads(tmp_path):
    # onnx.save_model puts every tensor in one file, each at its offset with its length.
    b = np.full((2, 3), 0.5, np.float32)
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"], name="mul"),
             helper.make_node("Add", ["h", "b"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", FLOAT, [2, 3])],
                              initializer=[numpy_helper.from_array(_W, "w"),
                                           numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = str(tmp_path / "model.onnx")
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = pullback.onnx.load(path)(x)
    np.testing.assert_array_equal(np.asarray(y), x * _W + b)


def test_external_data_outside_the_model_folder_is_refused(tmp_path):
    (tmp_path / "outside.bin").write_bytes(_W.tobytes())
    path = _write_model(tmp_path / "model", initializer=_external("w", _W, "../outside.bin"))
    with pytest.raises(BadModelError, match=r"initializer 'w'.*'\.\./outside\.bin'.*outside"):
        pullback.onnx.load(path)


def test_external_data_through_a_symlink_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "real.bin").write_bytes(_W.tobytes())
    os.symlink(folder / "real.bin", folder / "link.bin")
    path = _write_model(folder, constant=_external("w", _W, "link.bin"))
    with pytest.raises(BadModelError, match=r"Constant node 'const': attribute 'value'.*"
                                            r"'link\.bin'.*symbolic link"):
        pullback.onnx.load(path)


def test_external_data_from_a_device_is_refused(tmp_path):
    path = _write_model(tmp_path / "model", initializer=_external("w", _W, "/dev/zero"))
    with pytest.raises(BadModelError, match=r"initializer 'w'.*'/dev/zero'"):
        pullback.onnx.load(path)
    folder = tmp_path / "fifo"
    folder.mkdir()
    os.mkfifo(folder / "pipe.bin")  # opening it to read would block: it must not be opened
    path = _write_model(folder, initializer=_external("w", _W, "pipe.bin"))
    with pytest.raises(BadModelError, match=r"initializer 'w'.*'pipe\.bin'.*not regular file"):
        pullback.onnx.load(path)


def test_external_file_larger_than_its_tensor_is_refused_unread(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").write_bytes(b"\0" * (1 << 20))
    path = _write_model(folder, initializer=_external("w", _W, "w.bin"))
    with pytest.raises(BadModelError, match=r"initializer 'w': shape \(2, 3\) float32 needs 24 "
                                            r"bytes.*'w\.bin'.*holds 1,048,576"):
        pullback.onnx.load(path)


def test_external_tensor_over_the_limit_is_refused_before_reading(tmp_path):
    path = _write_model(tmp_path / "model", initializer=_external("w", _W, "missing.bin"))
    with pytest.raises(OnnxImportError, match=r"initializer 'w'.*24 bytes, over the limit of 16"):
        pullback.onnx.load(path, max_tensor_bytes=16)


def test_a_newer_opset_than_pullback_implements_is_refused():
    newest = highest_opset()
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r")]
    ins = [helper.make_tensor_value_info("x", FLOAT, [2])]
    outs = [helper.make_tensor_value_info("y", FLOAT, [2])]
    pullback.onnx.load(graph_model(nodes, ins, outs, opset=newest))
    with pytest.raises(OnnxImportError, match=rf"opset {newest + 1}, newer than opset {newest}"):
        pullback.onnx.load(graph_model(nodes, ins, outs, opset=newest + 1))
