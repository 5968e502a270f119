"""A checkpoint's metadata (step, RNG state, extras, checksum table) and each tensor's
name, dtype and shape are covered by its digest: no change to a digit of the header
loads silently."""

from __future__ import annotations

import json
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import pullback as pb
from pullback.io import CheckpointError, load_training, save_training


class Model:
    def __init__(self) -> None:
        self.state = {"w": pb.tensor(np.arange(6.0).reshape(2, 3)),
                      "b": pb.tensor(np.ones(3, np.float32))}

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = dict(state)


class Optimizer:
    def __init__(self) -> None:
        self.state = {"step_count": np.array(7), "state.0.m": np.zeros((3, 2))}

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = dict(state)


def _header_span(data: bytes) -> tuple[int, int]:
    return 8, 8 + struct.unpack("<Q", data[:8])[0]


def _save(path: Path) -> bytes:
    rng = np.random.default_rng(3)
    rng.random(5)
    save_training(path, model=Model(), optimizer=Optimizer(), step=12, rng=rng,
                  extra={"history": [{"epoch": 1, "loss": 0.25}], "config": {"lr": 0.002}})
    return path.read_bytes()


def test_every_one_digit_change_to_the_header_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "train.safetensors"
    data = _save(path)
    start, end = _header_span(data)
    digits = [i for i in range(start, end) if chr(data[i]).isdigit()]
    assert len(digits) > 100  # the RNG state alone has dozens
    silent = []
    for i in digits:
        changed = bytearray(data)
        changed[i] = ord(str((int(chr(data[i])) + 1) % 10))
        path.write_bytes(bytes(changed))
        try:
            load_training(path, model=Model(), optimizer=Optimizer())
        except CheckpointError as error:
            assert str(path) in str(error)
        else:
            silent.append(data[max(start, i - 30):i + 5].decode())
    assert not silent, silent


@pytest.mark.parametrize("field", ["pullback.step", "pullback.rng", "pullback.extra",
                                   "pullback.crc32", "pullback.format"])
def test_a_changed_digit_in_each_metadata_field_is_detected(tmp_path: Path,
                                                            field: str) -> None:
    path = tmp_path / "train.safetensors"
    data = _save(path)
    start, end = _header_span(data)
    metadata = json.loads(data[start:end])["__metadata__"]
    old = metadata[field]
    position = re.search(r"\d", old).start()
    new = old[:position] + str((int(old[position]) + 1) % 10) + old[position + 1:]
    # Same length, so the header keeps its size and only the digest can tell.
    changed = data[:start] + data[start:end].replace(json.dumps(old).encode(),
                                                     json.dumps(new).encode()) + data[end:]
    assert changed != data and len(changed) == len(data)
    path.write_bytes(changed)
    with pytest.raises(CheckpointError, match=r"fails its checksum|unknown checkpoint format"):
        load_training(path, model=Model(), optimizer=Optimizer())


def test_a_swapped_shape_of_the_same_size_is_detected(tmp_path: Path) -> None:
    # The bytes (and so their CRC-32) are the same; only the shape differs.
    path = tmp_path / "w.safetensors"
    pb.save({"w": np.arange(6.0).reshape(2, 3)}, path)
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"shape":[2,3]', b'"shape":[3,2]'))
    with pytest.raises(CheckpointError, match="fails its checksum"):
        pb.load(path)


def test_files_from_before_the_digest_still_load(tmp_path: Path) -> None:
    path = tmp_path / "v1.safetensors"
    array = np.arange(3.0)
    crc = zlib.crc32(array.view(np.uint8))
    save_file({"x": array}, str(path),
              metadata={"pullback.format": "1", "pullback.crc32": json.dumps({"x": crc})})
    np.testing.assert_array_equal(pb.load(path)["x"].numpy(), array)
