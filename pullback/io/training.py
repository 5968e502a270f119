"""Training checkpoints: model and optimizer state, step, RNG state and extras in one file.

Arrays go in as safetensors tensors ("model/<name>", "optim/<name>"); the step, the
NumPy generator's bit-generator state and the user's `extra` go in the string
metadata as JSON, so resuming reproduces the interrupted run exactly. That metadata
is covered by the file's digest (see checkpoint.py) and parsed strictly: whatever a
damaged file holds, loading raises `CheckpointError` or restores exactly what was saved.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from typing import Any, Protocol, TypedDict

import numpy as np
from numpy.typing import NDArray

from ..tensor import Tensor
from ..tensor.eager import wrap
from .checkpoint import PathLike, read_arrays, to_arrays, write_arrays
from .errors import CheckpointError
from .header import strict_json
from .state_check import check_state_dict

KIND_KEY = "pullback.kind"
STEP_KEY = "pullback.step"
RNG_KEY = "pullback.rng"
EXTRA_KEY = "pullback.extra"
MODEL_PREFIX = "model/"
OPTIM_PREFIX = "optim/"
# A step is a decimal count that fits an int64, as PyTorch's and NumPy's counters do.
_STEP = re.compile(r"0|[1-9][0-9]{0,18}")
_STEP_MAX = 2**63 - 1

# Bit generators whose `.state` round-trips through JSON (with the array encoding
# below); looked up by name from a whitelist, never by importing what a file says.
_BIT_GENERATORS = {
    cls.__name__: cls
    for cls in (np.random.PCG64, np.random.PCG64DXSM, np.random.MT19937,
                np.random.Philox, np.random.SFC64)
}


class ModelState(Protocol):
    """What a training checkpoint saves and restores of a model: an `nn.Module`, or
    anything with its `state_dict()` (name -> tensor) and `load_state_dict(state)`."""

    def state_dict(self) -> Mapping[str, Tensor]: ...

    def load_state_dict(self, state: dict[str, Tensor], /) -> object: ...


class OptimizerState(Protocol):
    """What a training checkpoint saves and restores of an optimizer: a `GradApplyer`,
    or anything with its flat `state_dict()` (name -> NumPy array) and
    `load_state_dict(state)`, which checks everything before it changes anything."""

    def state_dict(self) -> Mapping[str, NDArray[Any]]: ...

    def load_state_dict(self, state: Mapping[str, NDArray[Any]], /) -> object: ...


class TrainingInfo(TypedDict):
    """What `load_training` and `training_metadata` return besides the restored state."""

    step: int
    rng: np.random.Generator | None
    # The JSON the run saved as `extra` (tuples come back as lists).
    extra: dict[str, Any]


def _encode_array(value: object) -> object:
    # MT19937, Philox and SFC64 keep NumPy arrays in their state; PCG64 only big
    # Python ints, which json writes exactly.
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.tolist(), "dtype": value.dtype.str}
    if isinstance(value, np.integer):
        return int(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def _decode_array(obj: dict[str, Any]) -> object:
    if set(obj) == {"__ndarray__", "dtype"}:
        # Bit-generator states hold integer arrays only; any other dtype is corruption.
        dtype = np.dtype(obj["dtype"])
        if dtype.kind not in "iu":
            raise ValueError(f"RNG state array of dtype {dtype}")
        return np.array(obj["__ndarray__"], dtype=dtype)
    return obj


def rng_to_json(rng: np.random.Generator) -> str:
    """The generator's bit-generator state as JSON."""
    return json.dumps(rng.bit_generator.state, default=_encode_array)


def rng_from_json(text: str) -> np.random.Generator:
    """A new Generator whose next draws equal those of the one `rng_to_json` saw."""
    state = _walk_decode(strict_json(text))
    if not isinstance(state, dict) or state.get("bit_generator") not in _BIT_GENERATORS:
        raise ValueError("RNG state names no known bit generator")
    cls = _BIT_GENERATORS[state["bit_generator"]]
    bit_generator = cls()
    # The setter checks the state (a wrong one raises ValueError or TypeError); mypy
    # knows it as each generator's TypedDict, this is the dict the JSON held.
    bit_generator.state = state  # type: ignore[assignment]
    return np.random.Generator(bit_generator)


def _walk_decode(value: object) -> object:
    """`_decode_array` applied bottom-up (strict_json takes no object_hook)."""
    if isinstance(value, dict):
        return _decode_array({k: _walk_decode(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_walk_decode(v) for v in value]
    return value


def _check_json(value: object, where: str) -> None:
    """Reject what json would change silently on the way back (non-str keys, NaN aside)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has key {key!r}; JSON keys must be strings")
            _check_json(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_json(item, f"{where}[{index}]")
    elif not (value is None or isinstance(value, (str, int, float, bool))):
        raise TypeError(f"{where} is a {type(value).__name__}, not JSON-serializable")


def save_training(
    path: PathLike,
    *,
    model: ModelState,
    optimizer: OptimizerState,
    step: int,
    rng: np.random.Generator | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Save a resumable training state atomically to one safetensors file.

    `model.state_dict()` gives name -> tensor, `optimizer.state_dict()` a flat
    name -> NumPy array dict; `extra` must be JSON-serializable (tuples come back
    as lists). Raises `CheckpointError`, naming the file, for anything unstorable.
    """
    name = str(path)
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise CheckpointError(f"{name}: step must be a non-negative int, got {step!r}")
    if step > _STEP_MAX:
        # load_training would refuse the file: fail now, not at resume time.
        raise CheckpointError(f"{name}: step {step} does not fit an int64")
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise CheckpointError(
            f"{name}: rng must be a np.random.Generator or None, got {type(rng).__name__}"
        )
    if rng is not None and type(rng.bit_generator).__name__ not in _BIT_GENERATORS:
        raise CheckpointError(
            f"{name}: cannot save the state of a {type(rng.bit_generator).__name__} bit generator"
        )
    extra = {} if extra is None else extra
    try:
        if not isinstance(extra, Mapping):
            raise TypeError(f"extra is a {type(extra).__name__}, not a dict")
        _check_json(extra, "extra")
        extra_json = json.dumps(dict(extra))
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{name}: {error}") from error
    except RecursionError:
        raise CheckpointError(f"{name}: extra is nested too deeply to store") from None
    arrays = to_arrays(model.state_dict(), path, prefix=MODEL_PREFIX)
    arrays.update(to_arrays(optimizer.state_dict(), path, prefix=OPTIM_PREFIX))
    metadata = {KIND_KEY: "training", STEP_KEY: str(int(step)), EXTRA_KEY: extra_json}
    if rng is not None:
        metadata[RNG_KEY] = rng_to_json(rng)
    write_arrays(path, arrays, metadata)


def _read(path: PathLike) -> tuple[dict[str, np.ndarray], TrainingInfo]:
    """The arrays and the parsed {"step", "rng", "extra"} of a training checkpoint."""
    name = str(path)
    arrays, metadata = read_arrays(path)
    if metadata.get(KIND_KEY) != "training":
        raise CheckpointError(
            f"{name}: not a training checkpoint (no training metadata); use pb.load for weights"
        )
    try:
        text = metadata[STEP_KEY]
        if not _STEP.fullmatch(text) or int(text) > _STEP_MAX:
            raise ValueError(f"step {text[:40]!r} is not a count from 0 to {_STEP_MAX}")
        rng = rng_from_json(metadata[RNG_KEY]) if RNG_KEY in metadata else None
        extra = strict_json(metadata.get(EXTRA_KEY, "{}"))
        if not isinstance(extra, dict):
            raise TypeError("extra is not a dict")
    # Whatever a damaged string makes the parsers or the bit generator raise.
    except (KeyError, TypeError, ValueError, OverflowError, AttributeError,
            RecursionError) as error:
        detail = repr(error)
        # A damaged field can be megabytes long; the message quotes only its start.
        detail = detail if len(detail) <= 300 else detail[:300] + "..."
        raise CheckpointError(f"{name}: corrupt training metadata: {detail}") from error
    stray = [k for k in arrays if not k.startswith((MODEL_PREFIX, OPTIM_PREFIX))]
    if stray:
        raise CheckpointError(f"{name}: tensors outside model/ and optim/: {stray}")
    return arrays, {"step": int(text), "rng": rng, "extra": extra}


def training_metadata(path: PathLike) -> TrainingInfo:
    """What `load_training` returns ({"step", "rng", "extra"}), read and checked from
    the file without a model or optimizer (to compare a run's settings first)."""
    return _read(path)[1]


def load_training(path: PathLike, *, model: ModelState, optimizer: OptimizerState
                  ) -> TrainingInfo:
    """Restore model and optimizer state from `save_training`'s file.

    Returns {"step": int, "rng": np.random.Generator or None, "extra": dict}.
    Everything is read and checked before the model or optimizer is changed, so a
    bad file (or a model or optimizer it does not fit) leaves both as they were;
    every error is a `CheckpointError` naming the file.
    """
    name = str(path)
    arrays, info = _read(path)
    # Wrapped as pb.load wraps them: fresh arrays, in any stored dtype (pb.tensor
    # refuses float16, which a checkpoint may hold).
    model_state = {k.removeprefix(MODEL_PREFIX): wrap(a, None)
                   for k, a in arrays.items() if k.startswith(MODEL_PREFIX)}
    optim_state = {k.removeprefix(OPTIM_PREFIX): a
                   for k, a in arrays.items() if k.startswith(OPTIM_PREFIX)}
    expected = {k: (v.shape, v.dtype) for k, v in model.state_dict().items()}
    check_state_dict(expected, model_state, what=f"{name} (model state)")
    # The optimizer checks its whole state before changing any (optim's contract), so
    # it goes first; should it or the model then refuse, the optimizer gets its state
    # back (which also undoes a duck-typed optimizer that fails halfway).
    previous = optimizer.state_dict()
    try:
        optimizer.load_state_dict(optim_state)
    except (KeyError, TypeError, ValueError, IndexError) as error:
        with contextlib.suppress(KeyError, TypeError, ValueError, IndexError):
            optimizer.load_state_dict(previous)
        raise CheckpointError(f"{name} (optimizer state): {error}") from error
    try:
        model.load_state_dict(model_state)
    except (KeyError, TypeError, ValueError, IndexError) as error:
        optimizer.load_state_dict(previous)
        raise CheckpointError(f"{name} (model state): {error}") from error
    return info
