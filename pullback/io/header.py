"""A safetensors header read strictly, from a regular file only, before any tensor is.

safetensors itself accepts duplicate names (the last one wins), dtypes NumPy cannot
hold (complex, 8-bit floats) and blocks opening a FIFO; and Python's json recurses
without bound. Everything here fails as a `CheckpointError` naming the file instead.
`strict_json` is the JSON reader for the metadata strings too.
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Any, BinaryIO

import numpy as np

from .errors import CheckpointError

# The safetensors dtype codes pullback reads and writes: those NumPy has a dtype for.
DTYPE_OF_CODE = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16), "I16": np.dtype(np.int16), "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32), "U64": np.dtype(np.uint64), "I64": np.dtype(np.int64),
    "F16": np.dtype(np.float16), "F32": np.dtype(np.float32), "F64": np.dtype(np.float64),
}
CODE_OF_DTYPE = {dtype: code for code, dtype in DTYPE_OF_CODE.items()}

# safetensors' own cap on the header's size; a larger claim is corruption.
_HEADER_LIMIT = 100 * 1024 * 1024

TensorEntry = tuple[str, tuple[int, ...]]


def strict_json(text: str) -> Any:
    """`json.loads`, but a duplicate key or nesting too deep for the parser is a ValueError."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise ValueError(f"duplicate key {key!r}")
            result[key] = value
        return result

    try:
        return json.loads(text, object_pairs_hook=unique)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _open_regular(name: str) -> int:
    """A read-only descriptor of `name`, refusing anything but a regular file unopened."""
    try:
        mode = os.stat(name).st_mode
    except FileNotFoundError as error:
        raise CheckpointError(f"{name}: no such file") from error
    except OSError as error:
        raise CheckpointError(f"{name}: cannot read: {error}") from error
    if stat.S_ISDIR(mode):
        raise CheckpointError(f"{name}: is a directory, not a checkpoint file")
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{name}: not a regular file (a FIFO, socket or device); "
                              "a checkpoint must be a file")
    # O_NONBLOCK: should a FIFO replace the file after the stat, opening it cannot wait
    # for a writer; fstat below then refuses it.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(name, flags)
    except OSError as error:
        raise CheckpointError(f"{name}: cannot read: {error}") from error
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"{name}: not a regular file; a checkpoint must be a file")
    return fd


def read_header(name: str) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """The tensors ({name: (dtype code, shape)}, in the header's order) and the string
    metadata of the safetensors file `name`, checked; raises `CheckpointError`."""
    with os.fdopen(_open_regular(name), "rb") as file:
        size = os.fstat(file.fileno()).st_size
        try:
            return _parse(file, size)
        except (ValueError, TypeError, OverflowError) as error:
            if isinstance(error, CheckpointError):
                raise CheckpointError(f"{name}: {error}") from error
            raise CheckpointError(
                f"{name}: not a valid safetensors checkpoint (truncated or corrupt?): {error}"
            ) from error


def _parse(file: BinaryIO, size: int) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    prefix = file.read(8)
    if len(prefix) < 8:
        raise ValueError(f"{size} bytes is shorter than a safetensors header")
    length = int.from_bytes(prefix, "little")
    if length > min(_HEADER_LIMIT, size - 8):
        raise ValueError(f"its header claims {length} bytes; the file has {size}")
    header = strict_json(file.read(length).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
            isinstance(v, str) for v in metadata.values()):
        raise ValueError("its metadata is not a map of strings")
    data_size = size - 8 - length
    tensors: dict[str, TensorEntry] = {}
    for key, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"tensor {key!r}: entry is not dtype, shape and data_offsets")
        code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if code not in DTYPE_OF_CODE:
            # A CheckpointError passes through read_header with only the file name added.
            raise CheckpointError(
                f"tensor {key!r} has dtype {code}, which pullback cannot load (bool, "
                "integer and float16/32/64 tensors it can)")
        if not (isinstance(shape, list) and all(_is_count(n) for n in shape)):
            raise ValueError(f"tensor {key!r}: shape {shape!r} is not a list of sizes")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(_is_count(n) for n in offsets) and offsets[0] <= offsets[1] <= data_size):
            raise ValueError(f"tensor {key!r}: data_offsets {offsets!r} outside the file")
        if offsets[1] - offsets[0] != math.prod(shape) * DTYPE_OF_CODE[code].itemsize:
            raise ValueError(f"tensor {key!r}: data_offsets {offsets!r} do not fit "
                             f"shape {shape} of {code}")
        tensors[key] = (code, tuple(shape))
    return tensors, metadata
