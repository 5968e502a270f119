"""Checking a checkpoint's state dict against what a model expects (every problem at once)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from numpy.typing import DTypeLike

from ..nn.state import state_dict_mismatch
from .errors import CheckpointError


def check_state_dict(
    expected: Mapping[str, tuple[Sequence[int] | None, DTypeLike | None]],
    got: Mapping[str, object],
    *,
    what: str = "checkpoint",
) -> None:
    """Raise `CheckpointError` unless `got` has exactly the names, shapes and dtypes expected.

    `expected` maps each name to `(shape, dtype)`; `None` for either accepts any.
    The message starts with `what` (say, the file name) and lists missing names,
    unexpected names and every mismatch (name, expected, got) together.
    """
    message = state_dict_mismatch(expected, got, what=what)
    if message is not None:
        raise CheckpointError(message)
