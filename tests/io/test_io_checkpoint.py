"""pb.save / pb.load: round trips for every storable dtype, atomic writes, and errors
that name the file."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import pullback as pb
from pullback.io import CheckpointError, atomic

DTYPES = [np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64,
          np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]


def _sample(dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(0)
    if np.dtype(dtype).kind == "b":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def _good_file(path: Path) -> dict[str, np.ndarray]:
    state = {"weight": np.arange(4000, dtype=np.float32).reshape(40, 100),
             "bias": np.ones(100, dtype=np.float64)}
    pb.save(state, path)
    return state


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3, 4)], ids=str)
def test_round_trip_keeps_values_dtype_and_shape(tmp_path: Path, dtype: type,
                                                  shape: tuple[int, ...]) -> None:
    array = _sample(dtype, shape)
    pb.save({"x": array}, tmp_path / "ckpt.safetensors")
    loaded = pb.load(tmp_path / "ckpt.safetensors")
    assert list(loaded) == ["x"]
    assert isinstance(loaded["x"], pb.Tensor)
    assert loaded["x"].dtype == array.dtype and loaded["x"].shape == shape
    np.testing.assert_array_equal(loaded["x"].numpy(), array)


def test_tensors_load_without_grad_and_keep_saved_order(tmp_path: Path) -> None:
    state = {"z.weight": pb.tensor(np.ones((2, 2)), requires_grad=True),
             "a.bias": pb.tensor([1, 2, 3]),
             "m.mask": np.array([True, False])}
    pb.save(state, str(tmp_path / "m.safetensors"))
    loaded = pb.load(str(tmp_path / "m.safetensors"))
    assert list(loaded) == list(state)
    assert not any(t.requires_grad for t in loaded.values())
    np.testing.assert_array_equal(loaded["z.weight"].numpy(), np.ones((2, 2)))
    assert loaded["a.bias"].dtype == np.int64


def test_loaded_arrays_are_writable_copies(tmp_path: Path) -> None:
    pb.save({"w": np.zeros(3)}, tmp_path / "w.safetensors")
    array = pb.load(tmp_path / "w.safetensors")["w"].numpy()
    array[0] = 5.0  # must not touch the file nor raise
    assert pb.load(tmp_path / "w.safetensors")["w"].numpy()[0] == 0.0


def test_non_contiguous_big_endian_and_scalar_values_round_trip(tmp_path: Path) -> None:
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    state = {"strided": base[:, ::2], "transposed": base.T,
             "big_endian": np.arange(5, dtype=">i4"), "scalar": np.float32(2.5)}
    pb.save(state, tmp_path / "odd.safetensors")
    loaded = pb.load(tmp_path / "odd.safetensors")
    for name, value in state.items():
        np.testing.assert_array_equal(loaded[name].numpy(), np.asarray(value))
    assert loaded["big_endian"].dtype == np.int32
    assert loaded["scalar"].shape == ()


def test_empty_state_dict_round_trips(tmp_path: Path) -> None:
    pb.save({}, tmp_path / "empty.safetensors")
    assert pb.load(tmp_path / "empty.safetensors") == {}


def test_loads_plain_safetensors_files_from_other_tools(tmp_path: Path) -> None:
    path = tmp_path / "foreign.safetensors"
    save_file({"w": np.eye(3, dtype=np.float32)}, str(path), metadata={"format": "np"})
    np.testing.assert_array_equal(pb.load(path)["w"].numpy(), np.eye(3))


def test_save_overwrites_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.safetensors"
    pb.save({"w": np.zeros(2)}, path)
    pb.save({"w": np.ones(2)}, path)
    np.testing.assert_array_equal(pb.load(path)["w"].numpy(), np.ones(2))
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]


# --- atomicity ---------------------------------------------------------------


def _crash_halfway(fd: int, data: memoryview) -> None:
    os.write(fd, data[: len(data) // 2])
    raise OSError(28, "No space left on device")


def test_crash_mid_write_keeps_the_previous_file(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ckpt.safetensors"
    old = _good_file(path)
    before = path.read_bytes()
    monkeypatch.setattr(atomic, "_write_all", _crash_halfway)
    with pytest.raises(OSError, match="No space left"):
        pb.save({"weight": np.zeros((40, 100), np.float32)}, path)
    assert path.read_bytes() == before
    np.testing.assert_array_equal(pb.load(path)["weight"].numpy(), old["weight"])
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]


def test_crash_mid_write_leaves_no_file_when_there_was_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(atomic, "_write_all", _crash_halfway)
    with pytest.raises(OSError):
        pb.save({"w": np.zeros(1000)}, tmp_path / "new.safetensors")
    assert os.listdir(tmp_path) == []


def test_interrupt_mid_write_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(fd: int, data: memoryview) -> None:
        os.write(fd, data[:10])
        raise KeyboardInterrupt

    path = tmp_path / "ckpt.safetensors"
    _good_file(path)
    before = path.read_bytes()
    monkeypatch.setattr(atomic, "_write_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pb.save({"w": np.zeros(3)}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]


def test_write_is_synced_before_rename_and_directory_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        assert os.path.dirname(src) == os.path.dirname(dst)  # same directory, same fs
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(atomic.os, "replace", replace)
    pb.save({"w": np.zeros(3)}, tmp_path / "ckpt.safetensors")
    monkeypatch.undo()
    if os.name == "nt" or not os.path.isdir("/proc/self/fd"):
        pytest.skip("directory fsync is POSIX-only; fd kinds need /proc")
    assert events == ["fsync-file", "replace", "fsync-dir"]


# --- errors name the file ----------------------------------------------------


def test_error_is_a_value_error() -> None:
    assert issubclass(CheckpointError, ValueError)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.safetensors"
    with pytest.raises(CheckpointError, match="no such file") as error:
        pb.load(path)
    assert str(path) in str(error.value)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="directory") as error:
        pb.load(tmp_path)
    assert str(tmp_path) in str(error.value)


def test_truncated_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.safetensors"
    _good_file(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as error:
        pb.load(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("content", [
    b"",
    b"abc",
    np.random.default_rng(0).bytes(1000),
    b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!",
], ids=["empty", "short", "garbage", "bad-json"])
def test_garbage_bytes(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "garbage.safetensors"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as error:
        pb.load(path)
    assert str(path) in str(error.value)


def test_header_claiming_huge_sizes_is_rejected_without_allocating(tmp_path: Path) -> None:
    huge_header = tmp_path / "huge_header.safetensors"
    huge_header.write_bytes(struct.pack("<Q", 2**62) + b"{}")
    header = (b'{"w":{"dtype":"F32","shape":[1048576,1048576],'
              b'"data_offsets":[0,4398046511104]}}')
    huge_tensor = tmp_path / "huge_tensor.safetensors"
    huge_tensor.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)
    for path in (huge_header, huge_tensor):
        with pytest.raises(CheckpointError) as error:
            pb.load(path)  # a 4 TiB allocation would fail with MemoryError instead
        assert str(path) in str(error.value)


def test_flipped_byte_in_tensor_data_fails_the_checksum(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.safetensors"
    _good_file(path)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40  # inside the last tensor's bytes, past the header
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum") as error:
        pb.load(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("value", [[1.0, 2.0], 3.0, "w", None], ids=repr)
def test_value_that_is_not_an_array(tmp_path: Path, value: object) -> None:
    path = tmp_path / "bad.safetensors"
    with pytest.raises(CheckpointError, match=r"expected a pb\.Tensor or a NumPy array") as error:
        pb.save({"layer.weight": value}, path)
    assert str(path) in str(error.value) and "'layer.weight'" in str(error.value)
    assert not path.exists()


@pytest.mark.parametrize("key", [0, ("a", "b"), None], ids=repr)
def test_non_string_key(tmp_path: Path, key: object) -> None:
    path = tmp_path / "bad.safetensors"
    with pytest.raises(CheckpointError, match="keys must be strings") as error:
        pb.save({key: np.zeros(2)}, path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("array", [np.zeros(2, np.complex64), np.array(["a"]),
                                   np.array([object()])], ids=["complex", "str", "object"])
def test_unstorable_dtype(tmp_path: Path, array: np.ndarray) -> None:
    path = tmp_path / "bad.safetensors"
    with pytest.raises(CheckpointError, match="cannot store") as error:
        pb.save({"w": array}, path)
    assert str(path) in str(error.value)


def test_reserved_name(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="reserved"):
        pb.save({"__metadata__": np.zeros(2)}, tmp_path / "bad.safetensors")


def test_state_that_is_not_a_dict(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    with pytest.raises(CheckpointError, match="expected a dict") as error:
        pb.save([np.zeros(2)], path)  # type: ignore[arg-type]
    assert str(path) in str(error.value)


def test_missing_directory_on_save(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir.safetensors"
    with pytest.raises(CheckpointError, match="does not exist") as error:
        pb.save({"w": np.zeros(2)}, path)
    assert str(path) in str(error.value)
