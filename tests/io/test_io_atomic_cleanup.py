"""Temporary files that a killed write left behind are removed by the next save to
the folder; one that a live writer is still writing is not. And the writability probe."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pullback as pb
from pullback.io import atomic


def test_a_killed_writers_temporary_file_is_removed_by_the_next_save(tmp_path: Path) -> None:
    leftover = tmp_path / ".ckpt.safetensors.0123456789ab.tmp"
    leftover.write_bytes(b"half a checkpoint")  # its writer died: nobody holds its lock
    probe_leftover = tmp_path / ".pullback-probe.ba9876543210.tmp"
    probe_leftover.write_bytes(b"")
    pb.save({"w": np.zeros(2)}, tmp_path / "other.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["other.safetensors"]


def test_a_temporary_file_being_written_is_left_alone(tmp_path: Path) -> None:
    writing = tmp_path / ".big.safetensors.0123456789ab.tmp"
    fd = os.open(writing, os.O_WRONLY | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a live atomic_write holds it
        pb.save({"w": np.zeros(2)}, tmp_path / "small.safetensors")
        assert writing.exists()
    finally:
        os.close(fd)
    pb.save({"w": np.ones(2)}, tmp_path / "small.safetensors")
    assert not writing.exists()


def test_files_that_only_look_similar_are_kept(tmp_path: Path) -> None:
    kept = [".notes.tmp", "data.0123456789ab.tmp", ".x.0123456789AB.tmp", ".x.012345.tmp"]
    for name in kept:
        (tmp_path / name).write_bytes(b"mine")
    pb.save({"w": np.zeros(2)}, tmp_path / "w.safetensors")
    assert sorted(os.listdir(tmp_path)) == sorted([*kept, "w.safetensors"])


def test_the_writer_holds_its_lock_until_the_rename(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        # A cleaner running now must find the temporary file locked.
        fd = os.open(src, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append(False)
        except BlockingIOError:
            seen.append(True)
        finally:
            os.close(fd)
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    pb.save({"w": np.zeros(2)}, tmp_path / "w.safetensors")
    assert seen == [True]


def test_check_writable_passes_a_writable_folder_and_leaves_nothing(tmp_path: Path) -> None:
    atomic.check_writable(tmp_path)
    assert os.listdir(tmp_path) == []


def test_check_writable_refuses_what_the_permission_bits_refuse(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As root a chmod-ed folder stays writable, so the bits are stood in for by os.access.
    real_access = os.access
    monkeypatch.setattr(atomic.os, "access", lambda path, mode: False if Path(path) == tmp_path
                        else real_access(path, mode))
    with pytest.raises(PermissionError):
        atomic.check_writable(tmp_path)


def test_check_writable_refuses_a_folder_where_no_file_can_be_made(tmp_path: Path) -> None:
    # Even root cannot create a file under a regular file.
    regular = tmp_path / "file"
    regular.write_bytes(b"")
    with pytest.raises(OSError):
        atomic.check_writable(regular)


_CHILD = """
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("atomic", sys.argv[1])
atomic = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic)

def half_then_hang(fd, data):
    os.write(fd, data[: len(data) // 2])
    print("writing", flush=True)
    time.sleep(60)

atomic._write_all = half_then_hang
atomic.atomic_write(sys.argv[2], b"x" * 1000)
"""


def test_a_writer_killed_mid_write_leaves_a_file_the_next_save_removes(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD, atomic.__file__,
                              str(tmp_path / "big.safetensors")], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"writing\n"
        (leftover,) = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        pb.save({"w": np.zeros(2)}, tmp_path / "small.safetensors")
        assert leftover.exists()  # its writer is alive and holds the lock
    finally:
        child.kill()
        child.wait(timeout=10)
        child.stdout.close()
    assert leftover.exists()  # SIGKILL ran no cleanup
    pb.save({"w": np.ones(2)}, tmp_path / "small.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["small.safetensors"]
