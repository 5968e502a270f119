"""Malformed checkpoint files: every one is a `CheckpointError` naming the file, never
a raw RecursionError, OverflowError or AttributeError, and never a silent load."""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import pullback as pb
from pullback import nn, optim
from pullback.io import CheckpointError, load_training, save_training


def _raw(path: Path, header: bytes | dict, data: bytes = b"") -> Path:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def _model() -> nn.Module:
    return nn.Dense(2, 2)


def _load_training(path: Path) -> dict:
    model = _model()
    return load_training(path, model=model, optimizer=optim.SGD(model.parameters(), 0.1))


@pytest.mark.parametrize(("code", "itemsize"), [
    ("F8_E4M3", 1), ("F8_E5M2", 1), ("C64", 8), ("BF16", 2),
])
def test_dtypes_numpy_cannot_hold_are_refused(tmp_path: Path, code: str,
                                              itemsize: int) -> None:
    path = _raw(tmp_path / f"{code}.safetensors",
                {"x": {"dtype": code, "shape": [2], "data_offsets": [0, 2 * itemsize]}},
                b"\0" * (2 * itemsize))
    with pytest.raises(CheckpointError, match=f"dtype {code}, which pullback cannot load"):
        pb.load(path)


def test_complex_tensors_are_refused_on_load_as_on_save(tmp_path: Path) -> None:
    path = tmp_path / "complex.safetensors"
    with pytest.raises(CheckpointError, match="cannot store"):
        pb.save({"c": np.zeros(2, np.complex64)}, path)
    _raw(path, {"c": {"dtype": "C64", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 16)
    with pytest.raises(CheckpointError, match="dtype C64") as error:
        pb.load(path)
    assert str(path) in str(error.value)


def test_duplicate_tensor_names_are_refused(tmp_path: Path) -> None:
    # safetensors alone keeps the last entry, so this loaded as int32 1065353216.
    header = (b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
              b'"x":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}')
    path = _raw(tmp_path / "dup.safetensors", header, np.float32(1).tobytes())
    with pytest.raises(CheckpointError, match="duplicate key 'x'") as error:
        pb.load(path)
    assert str(path) in str(error.value)


def test_duplicate_metadata_keys_are_refused(tmp_path: Path) -> None:
    header = (b'{"__metadata__":{"pullback.step":"1","pullback.step":"9"},'
              b'"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}')
    path = _raw(tmp_path / "dup.safetensors", header, b"\0" * 4)
    with pytest.raises(CheckpointError, match=r"duplicate key 'pullback\.step'"):
        pb.load(path)


def test_a_header_nested_100000_deep_is_refused(tmp_path: Path) -> None:
    path = _raw(tmp_path / "deep.safetensors", b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(CheckpointError, match="nested too deeply") as error:
        pb.load(path)
    assert str(path) in str(error.value)


def _training_file(path: Path, **metadata: str) -> Path:
    model = _model()
    state = {f"model/{k}": v.numpy() for k, v in model.state_dict().items()}
    save_file(state, str(path),
              metadata={"pullback.kind": "training", "pullback.step": "1", **metadata})
    return path


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("metadata", [
    {"pullback.step": "-1"},
    {"pullback.step": "+1"},
    {"pullback.step": "1_000"},
    {"pullback.step": str(2**63)},
    {"pullback.step": "9" * 5000},
    {"pullback.extra": DEEP},
    {"pullback.rng": DEEP},
    {"pullback.extra": '{"a": 1, "a": 2}'},
    {"pullback.rng": json.dumps({"bit_generator": "PCG64", "state": {"state": 2**200,
                                                                      "inc": 1},
                                 "has_uint32": 0, "uinteger": 0})},
    {"pullback.rng": json.dumps({"bit_generator": "MT19937", "state": {
        "key": {"__ndarray__": [2**40] * 624, "dtype": "<u4"}, "pos": 0}})},
    {"pullback.rng": json.dumps({"bit_generator": "MT19937", "state": {
        "key": {"__ndarray__": [0] * 624, "dtype": "|O"}, "pos": 0}})},
    {"pullback.rng": json.dumps({"bit_generator": "os.system"})},
    {"pullback.rng": "[1, 2]"},
    {"pullback.rng": '"PCG64"'},
], ids=["negative-step", "plus-step", "underscore-step", "step-past-int64", "huge-step",
        "deep-extra", "deep-rng", "duplicate-extra-key", "pcg-state-too-large",
        "mt-key-too-large", "object-dtype", "unknown-bit-generator", "rng-list", "rng-string"])
def test_bad_training_metadata_is_a_checkpoint_error(tmp_path: Path,
                                                     metadata: dict[str, str]) -> None:
    path = _training_file(tmp_path / "train.safetensors", **metadata)
    with pytest.raises(CheckpointError, match="corrupt training metadata") as error:
        _load_training(path)
    assert str(path) in str(error.value)
    assert len(str(error.value)) < 1000


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            pb.load(fifo)
            outcome.append(None)
        except BaseException as error:  # handed to the main thread
            outcome.append(error)

    reader = threading.Thread(target=attempt, daemon=True)
    reader.start()
    reader.join(timeout=5)
    if reader.is_alive():
        # Unblock the reader (a writer's open completes its open) before failing.
        with open(fifo, "wb"):
            pass
        reader.join(timeout=5)
        pytest.fail("pb.load blocked on a FIFO")
    assert isinstance(outcome[0], CheckpointError), outcome
    assert "not a regular file" in str(outcome[0]) and str(fifo) in str(outcome[0])


def test_a_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a regular file"):
        pb.load(os.devnull)


def test_save_training_still_refuses_a_negative_step(tmp_path: Path) -> None:
    model = _model()
    with pytest.raises(CheckpointError, match="non-negative"):
        save_training(tmp_path / "t.safetensors", model=model,
                      optimizer=optim.SGD(model.parameters(), 0.1), step=-1)
