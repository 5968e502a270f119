"""`pb.save` and `pb.load`: state dicts as safetensors files, never pickle.

Files are written atomically and carry a CRC-32 per tensor and a SHA-256 digest of
the rest (the metadata and every tensor's name, dtype and shape), so a truncated,
garbled or bit-flipped file is reported (naming the file) instead of loading as wrong
numbers or wrong state. Files without checksums (written by other tools) load too.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import safetensors.numpy
from numpy.typing import NDArray
from safetensors import SafetensorError, safe_open

from ..tensor import Tensor
from ..tensor.eager import wrap
from .atomic import atomic_write
from .errors import CheckpointError
from .header import CODE_OF_DTYPE, DTYPE_OF_CODE, TensorEntry, read_header, strict_json

PathLike = str | os.PathLike[str]

# What a checkpoint stores: names -> tensors or NumPy arrays (a module's or an
# optimizer's `state_dict()`).
StateDict = Mapping[str, Tensor | NDArray[Any] | np.generic]

FORMAT_KEY = "pullback.format"
CRC_KEY = "pullback.crc32"
DIGEST_KEY = "pullback.digest"
# Version 1 files have tensor checksums only; version 2 adds the digest and requires it.
_FORMAT_VERSION = "2"
_KNOWN_VERSIONS = ("1", "2")

# What safetensors can store and NumPy can read back (bfloat16 has no NumPy dtype).
_STORABLE = frozenset(DTYPE_OF_CODE.values())


def _little_endian(array: np.ndarray) -> np.ndarray:
    # safetensors stores little-endian bytes; checksums are taken over those bytes.
    # It reads raw memory, so strided views must be made contiguous (np.require,
    # unlike np.ascontiguousarray, keeps 0-d arrays 0-d).
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return np.require(little, requirements="C")


def _crc32(array: np.ndarray) -> int:
    return zlib.crc32(_little_endian(array).reshape(-1).view(np.uint8).data)


def _digest(metadata: Mapping[str, str], tensors: Mapping[str, TensorEntry]) -> str:
    """SHA-256 over a canonical JSON of everything in the header that shapes the loaded
    state but is not a tensor's bytes (those have their CRC-32s, listed in `metadata`)."""
    canonical = json.dumps(
        {"metadata": {k: v for k, v in metadata.items() if k != DIGEST_KEY},
         "tensors": {k: [code, list(shape)] for k, (code, shape) in tensors.items()}},
        sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()


def to_arrays(state: object, path: PathLike, *, prefix: str = "") -> dict[str, np.ndarray]:
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
        **(metadata or {}),
        FORMAT_KEY: _FORMAT_VERSION,
        # A JSON object keeps insertion order, so it also records the names' order.
        CRC_KEY: json.dumps({key: _crc32(array) for key, array in arrays.items()}),
    }
    tensors = {key: (CODE_OF_DTYPE[array.dtype.newbyteorder("=")], array.shape)
               for key, array in arrays.items()}
    header[DIGEST_KEY] = _digest(header, tensors)
    try:
        data = safetensors.numpy.save(arrays, metadata=header)
    except (SafetensorError, TypeError, ValueError) as error:
        raise CheckpointError(f"{name}: cannot serialize: {error}") from error
    atomic_write(name, data)


def read_arrays(path: PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read every array and the string metadata of a safetensors file, checked."""
    name = os.fspath(path)
    # Refuses what is not a regular file, duplicate names and dtypes NumPy lacks, and
    # verifies the metadata, before safetensors maps the file.
    tensors, metadata = read_header(name)
    _check_digest(name, metadata, tensors)
    try:
        # safe_open validates the header against the file size before reading any
        # tensor, so a corrupt header claiming huge sizes cannot make us allocate;
        # each tensor is then read exactly once.
        with safe_open(name, framework="np") as file:
            arrays = {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118
    except FileNotFoundError as error:
        raise CheckpointError(f"{name}: no such file") from error
    except OSError as error:
        raise CheckpointError(f"{name}: cannot read: {error}") from error
    except (SafetensorError, TypeError, ValueError, KeyError, OverflowError,
            AttributeError) as error:
        raise CheckpointError(
            f"{name}: not a valid safetensors checkpoint (truncated or corrupt?): {error}"
        ) from error
    if set(arrays) != set(tensors):
        raise CheckpointError(f"{name}: the file changed while it was being read")
    return _checked(name, arrays, metadata), metadata


def _check_digest(name: str, metadata: Mapping[str, str],
                  tensors: Mapping[str, TensorEntry]) -> None:
    """Verify the header digest where the file has one (and in every version-2 file)."""
    version = metadata.get(FORMAT_KEY)
    if version is not None and version not in _KNOWN_VERSIONS:
        raise CheckpointError(f"{name}: unknown checkpoint format version {version!r} "
                              "(written by a newer pullback, or corrupt)")
    if DIGEST_KEY not in metadata and version in (None, "1"):
        return
    if metadata.get(DIGEST_KEY) != _digest(metadata, tensors):
        raise CheckpointError(f"{name}: corrupt checkpoint: its metadata (or a tensor's "
                              "name, dtype or shape) fails its checksum")


def _checked(
    name: str, arrays: dict[str, np.ndarray], metadata: Mapping[str, str]
) -> dict[str, np.ndarray]:
    """Verify checksums where present; return the arrays in the order they were saved."""
    if CRC_KEY not in metadata:
        return arrays
    try:
        checksums = strict_json(metadata[CRC_KEY])
        valid = isinstance(checksums, dict) and all(
            isinstance(c, int) and not isinstance(c, bool) for c in checksums.values())
    except ValueError:
        valid = False
    if not valid or set(checksums) != set(arrays):
        raise CheckpointError(f"{name}: corrupt checkpoint: its checksum table does not match")
    for key, expected in checksums.items():
        if _crc32(arrays[key]) != expected:
            raise CheckpointError(f"{name}: corrupt checkpoint: tensor {key!r} fails its checksum")
    return {key: arrays[key] for key in checksums}


def save(state_dict: StateDict, path: PathLike) -> None:
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
    return {key: wrap(array, None) for key, array in arrays.items()}
