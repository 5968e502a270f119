"""`pb.save` and `pb.load`: state dicts as safetensors files, never pickle.

Files are written atomically and carry a CRC-32 per tensor in their metadata, so a
truncated, garbled or bit-flipped file is reported (naming the file) instead of
loading as wrong numbers. Files without checksums (written by other tools) load too.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import safetensors.numpy
from safetensors import SafetensorError, safe_open

from ..tensor import Tensor
from ..tensor.eager import _wrap
from .atomic import atomic_write
from .errors import CheckpointError

PathLike = str | os.PathLike[str]

FORMAT_KEY = "pullback.format"
CRC_KEY = "pullback.crc32"
_FORMAT_VERSION = "1"

# What safetensors can store and NumPy can read back (bfloat16 has no NumPy dtype).
_STORABLE = frozenset(
    np.dtype(t)
    for t in (
        np.bool_, np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32,
        np.uint64, np.int64, np.float16, np.float32, np.float64,
    )
)


def _little_endian(array: np.ndarray) -> np.ndarray:
    # safetensors stores little-endian bytes; checksums are taken over those bytes.
    # It reads raw memory, so strided views must be made contiguous (np.require,
    # unlike np.ascontiguousarray, keeps 0-d arrays 0-d).
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return np.require(little, requirements="C")


def _crc32(array: np.ndarray) -> int:
    return zlib.crc32(_little_endian(array).reshape(-1).view(np.uint8))


def to_arrays(state: Any, path: PathLike, *, prefix: str = "") -> dict[str, np.ndarray]:
    """Validate a state dict and return its values as contiguous little-endian arrays.

    `prefix` is prepended to every name (training checkpoints keep model and
    optimizer state apart as "model/..." and "optim/...").
    """
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"{os.fspath(path)}: expected a dict of name -> tensor, got {type(state).__name__}"
        )
    arrays: dict[str, np.ndarray] = {}
    for name, value in state.items():
        if not isinstance(name, str):
            raise CheckpointError(
                f"{os.fspath(path)}: key {name!r} is a {type(name).__name__}; "
                "state dict keys must be strings"
            )
        full_name = prefix + name
        if full_name == "__metadata__":
            # safetensors reserves this header entry for the string metadata.
            raise CheckpointError(f"{os.fspath(path)}: '__metadata__' is a reserved name")
        if isinstance(value, Tensor):
            array = np.asarray(value.numpy())
        elif isinstance(value, (np.ndarray, np.generic)):
            array = np.asarray(value)
        else:
            raise CheckpointError(
                f"{os.fspath(path)}: {full_name!r} is a {type(value).__name__}, "
                "expected a pb.Tensor or a NumPy array"
            )
        if array.dtype.newbyteorder("=") not in _STORABLE:
            raise CheckpointError(
                f"{os.fspath(path)}: {full_name!r} has dtype {array.dtype}, which a "
                "checkpoint cannot store (bool, integer and float16/32/64 arrays can)"
            )
        arrays[full_name] = _little_endian(array)
    return arrays


def write_arrays(
    path: PathLike, arrays: dict[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> None:
    """Write validated arrays (from `to_arrays`) and string metadata atomically."""
    name = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(name))
    if not os.path.isdir(directory):
        raise CheckpointError(f"{name}: directory {directory} does not exist")
    header = {
        FORMAT_KEY: _FORMAT_VERSION,
        # A JSON object keeps insertion order, so it also records the names' order.
        CRC_KEY: json.dumps({key: _crc32(array) for key, array in arrays.items()}),
        **(metadata or {}),
    }
    try:
        data = safetensors.numpy.save(arrays, metadata=header)
    except (SafetensorError, TypeError, ValueError) as error:
        raise CheckpointError(f"{name}: cannot serialize: {error}") from error
    atomic_write(name, data)


def read_arrays(path: PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read every array and the string metadata of a safetensors file, checked."""
    name = os.fspath(path)
    if os.path.isdir(name):
        raise CheckpointError(f"{name}: is a directory, not a checkpoint file")
    try:
        # safe_open validates the header against the file size before reading any
        # tensor, so a corrupt header claiming huge sizes cannot make us allocate;
        # each tensor is then read exactly once.
        with safe_open(name, framework="np") as file:
            metadata = dict(file.metadata() or {})
            arrays = {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118
    except FileNotFoundError as error:
        raise CheckpointError(f"{name}: no such file") from error
    except OSError as error:
        raise CheckpointError(f"{name}: cannot read: {error}") from error
    except (SafetensorError, TypeError, ValueError, KeyError, OverflowError) as error:
        raise CheckpointError(
            f"{name}: not a valid safetensors checkpoint (truncated or corrupt?): {error}"
        ) from error
    return _checked(name, arrays, metadata), metadata


def _checked(
    name: str, arrays: dict[str, np.ndarray], metadata: Mapping[str, str]
) -> dict[str, np.ndarray]:
    """Verify checksums where present; return the arrays in the order they were saved."""
    if CRC_KEY not in metadata:
        return arrays
    try:
        checksums = json.loads(metadata[CRC_KEY])
        valid = isinstance(checksums, dict) and all(isinstance(c, int) for c in checksums.values())
    except json.JSONDecodeError:
        valid = False
    if not valid or set(checksums) != set(arrays):
        raise CheckpointError(f"{name}: corrupt checkpoint: its checksum table does not match")
    for key, expected in checksums.items():
        if _crc32(arrays[key]) != expected:
            raise CheckpointError(f"{name}: corrupt checkpoint: tensor {key!r} fails its checksum")
    return {key: arrays[key] for key in checksums}


def save(state_dict: Mapping[str, Any], path: PathLike) -> None:
    """Save a dict of name -> `pb.Tensor` or NumPy array to a safetensors file.

    The write is atomic: a crash leaves either the previous file or the new one.
    Raises `CheckpointError` for non-string keys or values that are not arrays.
    """
    write_arrays(path, to_arrays(state_dict, path))


def load(path: PathLike) -> dict[str, Tensor]:
    """Load a safetensors file as a dict of name -> `pb.Tensor` (not requiring grad).

    Raises `CheckpointError`, naming the file, if it is missing, truncated or corrupt.
    """
    arrays, _ = read_arrays(path)
    # The arrays are fresh from the file and ours: wrapped, not copied, and in any
    # stored dtype (a float16 checkpoint loads as float16, to be cast).
    return {key: _wrap(array, None) for key, array in arrays.items()}
