"""take, take_along_axis and nn.Embedding export as ONNX Gather and GatherElements,
their indices read from the graph's inputs, run in onnxruntime to pullback's outputs,
and load back (GatherElements with ONNX's own rule for smaller indices)."""

from __future__ import annotations

import numpy as np
import onnx
from graphs import node_model, run_onnxruntime

import pullback as pb
import pullback.onnx
from pullback import nn

rng = np.random.default_rng(12)


def _run(fn, inputs, tmp_path) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    path = tmp_path / "model.onnx"
    proto = pullback.onnx.export(fn, inputs, path)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    names = [i.name for i in proto.graph.input]
    return proto, run_onnxruntime(path.read_bytes(), dict(zip(names, inputs)))


def _op_types(proto: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in proto.graph.node}


def test_take_exports_as_gather_with_indices_from_the_inputs(tmp_path) -> None:
    x = rng.standard_normal((5, 4, 3)).astype(np.float32)
    ids = np.array([[4, -1], [0, 2]])
    picks = np.array([0, 0, 2], np.int32)

    def fn(x, ids, picks):
        return pb.take(x, ids) * 2.0, pb.take(x, picks, axis=-1), pb.take(x, np.array([3]), 1)

    proto, outputs = _run(fn, (x, ids, picks), tmp_path)
    assert _op_types(proto) >= {"Gather"} and "GatherElements" not in _op_types(proto)
    expected = [np.take(x, ids, 0) * 2, np.take(x, picks, 2), np.take(x, [3], 1)]
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_take_along_axis_exports_as_gather_elements_broadcasting_both_sides(tmp_path) -> None:
    x = rng.standard_normal((1, 3, 4)).astype(np.float32)
    along = np.array([[[2], [0], [-1]], [[1], [1], [0]]])  # (2, 3, 1) against x (1, 3, 4)
    rows = np.array([[[0, 2, 1, 0]]])  # a constant, along axis 1

    def fn(x, along):
        return pb.take_along_axis(x, along, 2), pb.take_along_axis(x, rows, 1)

    proto, outputs = _run(fn, (x, along), tmp_path)
    assert "GatherElements" in _op_types(proto)
    expected = [np.take_along_axis(x, along, 2), np.take_along_axis(x, rows, 1)]
    for got, want in zip(outputs, expected, strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    reloaded = pullback.onnx.load(tmp_path / "model.onnx")(x, along)
    for got, want in zip(reloaded, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)


def test_gather_elements_loads_with_onnx_semantics_for_smaller_indices() -> None:
    # ONNX reads only the leading part of data on the other axes (no broadcasting).
    x = rng.standard_normal((3, 4)).astype(np.float32)
    indices = np.array([[2, -1], [0, 1]])
    model = node_model("GatherElements", {"x": x, "i": indices}, {"axis": 0})
    (want,) = run_onnxruntime(model, {"x": x, "i": indices})
    (got,) = pullback.onnx.load(model)(x, indices)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_an_embedding_with_padding_exports_and_runs_alike(tmp_path) -> None:
    pb.manual_seed(1)
    model = nn.Sequential(nn.Embedding(7, 4, padding_idx=0), nn.Dense(4, 2))
    ids = np.array([[0, 6, 3], [3, 0, 1]])
    proto, (out,) = _run(model, (ids,), tmp_path)
    with pb.no_grad():
        expected = model(ids).numpy()
    assert "Gather" in _op_types(proto)
    assert "0.weight" in {t.name for t in proto.graph.initializer}
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    other = np.array([[1, 2, 0], [6, 6, 5]])  # the reloaded model reads its ids as an input
    reloaded = pullback.onnx.load(tmp_path / "model.onnx")(other)[0]
    with pb.no_grad():
        np.testing.assert_allclose(np.asarray(reloaded), model(other).numpy(), rtol=1e-6,
                                   atol=1e-6)
