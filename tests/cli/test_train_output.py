"""`pullback train`'s output folder: every file-system failure is one line and exit
code 2 before training starts; an existing run is never overwritten silently; a
damaged checkpoint is refused on --resume, and other settings are named."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import pytest

import pullback.training as training
from pullback.cli import main
from pullback.io import CheckpointError
from pullback.training import TrainConfig, train

QUICK = ["--epochs", "1", "--model", "mlp", "--no-progress"]


def _quiet(message: str) -> None:
    pass


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test should training start: every check must come before."""

    def started(name: str) -> None:
        raise AssertionError("training started")

    monkeypatch.setattr(training, "build_model", started)


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(("pullback train: ", "pullback train --resume: "))
    assert "train: train" not in lines[0]
    assert "test accuracy" not in captured.out
    return lines[0]


def test_an_existing_checkpoint_is_not_overwritten_without_resume_or_overwrite(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["train", *QUICK, "--output", str(tmp_path)]) == 0
    checkpoint = tmp_path / "checkpoint.safetensors"
    before = checkpoint.read_bytes()
    capsys.readouterr()
    with monkeypatch.context() as patch:
        patch.setattr(training, "build_model", lambda name: pytest.fail("training started"))
        # Even a run of another model is refused: the file would be replaced either way.
        assert main(["train", "--epochs", "1", "--model", "cnn", "--no-progress",
                     "--output", str(tmp_path)]) == 2
    line = _one_line_error(capsys)
    assert str(checkpoint) in line and "--resume" in line and "--overwrite" in line
    assert checkpoint.read_bytes() == before
    assert main(["train", *QUICK, "--seed", "1", "--overwrite", "--output", str(tmp_path)]) == 0
    assert checkpoint.read_bytes() != before


def test_resume_and_overwrite_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--resume", "--overwrite", "--output", str(tmp_path)])
    assert exit_.value.code == 2


def test_output_that_is_an_existing_file(tmp_path: Path, capsys, no_training) -> None:
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    assert main(["train", *QUICK, "--output", str(existing)]) == 2
    assert f"{existing} is a file, not a folder" in _one_line_error(capsys)
    assert existing.read_text() == "mine"


def test_output_under_a_file(tmp_path: Path, capsys, no_training) -> None:
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    assert main(["train", *QUICK, "--output", str(existing / "run")]) == 2
    line = _one_line_error(capsys)
    assert "cannot create the output folder" in line and f"{existing} is a file" in line


def test_empty_output(capsys, no_training) -> None:
    assert main(["train", *QUICK, "--output", ""]) == 2
    assert "--output is empty" in _one_line_error(capsys)


def test_read_only_output_folder_fails_before_training(
        tmp_path: Path, capsys, no_training, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root (as in CI) writes to a chmod 0o555 folder regardless, so what a non-root user
    # sees is stood in for through os.access, which the probe asks first.
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == folder
                        else real_access(path, mode))
    try:
        assert main(["train", *QUICK, "--output", str(folder)]) == 2
    finally:
        folder.chmod(0o755)
    line = _one_line_error(capsys)
    assert f"cannot write to the output folder {folder}" in line
    assert "Permission denied" in line


def test_a_failing_probe_file_is_reported_too(tmp_path: Path, capsys, no_training,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # What the permission bits do not show (a read-only mount): creating the probe fails.
    from pullback.io import atomic

    real_open = os.open

    def read_only_mount(path, flags, *args):
        if "pullback-probe" in str(path):
            raise OSError(30, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(atomic.os, "open", read_only_mount)
    assert main(["train", *QUICK, "--output", str(tmp_path)]) == 2
    assert "Read-only file system" in _one_line_error(capsys)


def _change_a_digit_of_the_rng_state(path: Path) -> None:
    data = path.read_bytes()
    start, end = 8, 8 + struct.unpack("<Q", data[:8])[0]
    header = data[start:end]
    rng = json.loads(header)["__metadata__"]["pullback.rng"]
    state = re.search(r'"state": (\d+)', rng)
    digit = state.start(1) + 5
    changed = rng[:digit] + str((int(rng[digit]) + 1) % 10) + rng[digit + 1:]
    new_header = header.replace(json.dumps(rng).encode(), json.dumps(changed).encode())
    assert new_header != header and len(new_header) == len(header)
    path.write_bytes(data[:start] + new_header + data[end:])


def test_a_changed_rng_digit_is_refused_on_resume(tmp_path: Path, capsys) -> None:
    config = {"epochs": 2, "model": "mlp", "batch_size": 256}
    train(TrainConfig(output=str(tmp_path), **config), progress=False, log=_quiet,
          stop_after=1)
    _change_a_digit_of_the_rng_state(tmp_path / "checkpoint.safetensors")
    with pytest.raises(CheckpointError, match="fails its checksum"):
        train(TrainConfig(output=str(tmp_path), **config), resume=True, progress=False,
              log=_quiet)
    assert main(["train", "--epochs", "2", "--model", "mlp", "--batch-size", "256",
                 "--no-progress", "--resume", "--output", str(tmp_path)]) == 2
    assert "checkpoint.safetensors: corrupt checkpoint" in _one_line_error(capsys)


def test_resume_with_other_settings_names_them(tmp_path: Path, capsys) -> None:
    assert main(["train", *QUICK, "--optimizer", "sgd", "--output", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["train", "--epochs", "2", "--model", "mlp", "--no-progress", "--resume",
                 "--optimizer", "adam", "--output", str(tmp_path)]) == 2
    line = _one_line_error(capsys)
    assert "--optimizer 'sgd' (now 'adam')" in line and "--epochs 1 (now 2)" in line
    assert "step_count" not in line and "missing" not in line
