"""`pullback run model.onnx --input x.npy [--output y.npy]`: output shapes, timing, saved
outputs, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from graphs import node_model

from pullback.cli import main


def _model(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    path = tmp_path / "relu.onnx"
    path.write_bytes(node_model("Relu", {"x": x}))
    np.save(tmp_path / "x.npy", x)
    return path, x


def test_run_prints_shapes_and_timing_and_saves_the_output(tmp_path, capsys):
    path, x = _model(tmp_path)
    out = tmp_path / "y.npy"
    assert main(["run", str(path), "--input", str(tmp_path / "x.npy"), "--output", str(out),
                 "--repeat", "2"]) == 0
    printed = capsys.readouterr().out
    assert "input x: (2, 3) float32" in printed
    assert "output y0: (2, 3) float32" in printed
    assert "mode: plan" in printed
    assert "first call" in printed and "median of 2" in printed
    np.testing.assert_array_equal(np.load(out), np.maximum(x, 0))


def test_run_with_a_bad_model_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\x08\x07garbage")
    np.save(tmp_path / "x.npy", np.ones(2, np.float32))
    assert main(["run", str(path), "--input", str(tmp_path / "x.npy")]) == 2
    assert "pullback run:" in capsys.readouterr().err


def test_run_with_the_wrong_number_of_inputs_says_what_it_takes(tmp_path, capsys):
    path, _ = _model(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(path)])
    assert exit_.value.code == 2
    assert "takes 1 inputs (x)" in capsys.readouterr().err


def test_run_with_an_input_of_the_wrong_dtype_names_it(tmp_path, capsys):
    path, _ = _model(tmp_path)
    np.save(tmp_path / "x64.npy", np.ones((2, 3)))
    assert main(["run", str(path), "--input", str(tmp_path / "x64.npy")]) == 2
    assert "input 'x'" in capsys.readouterr().err
