"""`pullback run --output`: the file written is the one named (and the one reported),
and an output path that cannot be written is one line and exit code 2, before the run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import pullback.onnx
from pullback.cli import main


def _relu_model(tmp_path: Path) -> tuple[Path, Path]:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "relu.onnx"
    path.write_bytes(model.SerializeToString())
    x = tmp_path / "x.npy"
    np.save(x, np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5)
    return path, x


def test_the_output_is_written_under_exactly_the_name_given(tmp_path: Path, capsys) -> None:
    model, x = _relu_model(tmp_path)
    out = tmp_path / "adir.onnx"
    assert main(["run", str(model), "--input", str(x), "--output", str(out),
                 "--repeat", "0"]) == 0
    assert f"saved {out}" in capsys.readouterr().out
    assert not (tmp_path / "adir.onnx.npy").exists()  # np.save(path) would have added it
    np.testing.assert_array_equal(np.load(out), np.maximum(np.load(x), 0))


@pytest.mark.parametrize("case", ["folder", "under-a-file", "no-folder", "empty"])
def test_an_output_that_cannot_be_written_fails_before_running(
        tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    model, x = _relu_model(tmp_path)
    (tmp_path / "adir.onnx").mkdir()
    (tmp_path / "file").write_text("mine")
    out = {"folder": tmp_path / "adir.onnx", "under-a-file": tmp_path / "file" / "y.npy",
           "no-folder": tmp_path / "nowhere" / "y.npy", "empty": ""}[case]
    monkeypatch.setattr(pullback.onnx, "load",
                        lambda *a, **k: pytest.fail("the model was loaded"))
    assert main(["run", str(model), "--input", str(x), "--output", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pullback run: --output"), captured.err
    assert str(out) in lines[0]
    expected = {"folder": "is a folder", "under-a-file": "file is a file",
                "no-folder": "nowhere does not exist", "empty": "is empty"}[case]
    assert expected in lines[0]
    assert (tmp_path / "file").read_text() == "mine"
