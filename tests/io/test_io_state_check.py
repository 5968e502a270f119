"""check_state_dict reports every missing, unexpected and mismatched entry in one error."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback.io import CheckpointError, check_state_dict

EXPECTED = {
    "conv.weight": ((8, 1, 3, 3), np.float32),
    "conv.bias": ((8,), np.float32),
    "fc.weight": ((10, 32), np.float32),
    "fc.bias": ((10,), np.float32),
}


def _matching() -> dict[str, object]:
    return {name: np.zeros(shape, dtype) for name, (shape, dtype) in EXPECTED.items()}


def test_matching_state_passes_with_arrays_or_tensors() -> None:
    state = _matching()
    check_state_dict(EXPECTED, state)
    check_state_dict(EXPECTED, {k: pb.tensor(v) for k, v in state.items()})


def test_lists_missing_unexpected_and_mismatches_at_once() -> None:
    state = _matching()
    del state["fc.bias"], state["fc.weight"]
    state["head.w"] = np.zeros(3, np.float32)
    state["conv.weight"] = np.zeros((8, 1, 5, 5), np.float32)
    state["conv.bias"] = np.zeros(8, np.float64)
    with pytest.raises(CheckpointError) as error:
        check_state_dict(EXPECTED, state, what="checkpoint model.safetensors")
    message = str(error.value)
    assert message.startswith("checkpoint model.safetensors does not match")
    assert "2 missing, 1 unexpected, 2 mismatched" in message
    assert "missing: 'fc.weight', 'fc.bias'" in message
    assert "unexpected: 'head.w'" in message
    assert "'conv.weight': expected (8, 1, 3, 3) float32, got (8, 1, 5, 5) float32" in message
    assert "'conv.bias': expected (8,) float32, got (8,) float64" in message


def test_none_accepts_any_shape_or_dtype() -> None:
    check_state_dict({"w": (None, np.float32), "b": ((2,), None)},
                     {"w": np.zeros((7, 7), np.float32), "b": np.zeros(2, np.int64)})


def test_value_without_shape_is_reported() -> None:
    with pytest.raises(CheckpointError, match="'w': expected \\(2,\\) float32, got a list"):
        check_state_dict({"w": ((2,), np.float32)}, {"w": [1.0, 2.0]})


def test_long_lists_are_cut_short() -> None:
    expected = {f"layer{i}.weight": ((1,), np.float32) for i in range(100)}
    with pytest.raises(CheckpointError) as error:
        check_state_dict(expected, {})
    message = str(error.value)
    assert "100 missing" in message and "... and 80 more" in message
    assert "'layer19.weight'" in message and "'layer20.weight'" not in message
