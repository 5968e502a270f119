"""Checking a state dict against what a model expects, reporting every problem at once.

One error listing all missing names, unexpected names and shape/dtype mismatches
saves the fix-one-rerun-fix-the-next loop when a checkpoint and a model disagree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import DTypeLike

_MAX_LISTED = 20


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    hidden = len(items) - _MAX_LISTED
    return shown + (f", ... and {hidden} more" if hidden > 0 else "")


def _describe(shape: tuple[int, ...] | None, dtype: np.dtype | None) -> str:
    return f"{'any shape' if shape is None else shape} {'any dtype' if dtype is None else dtype}"


def state_dict_mismatch(
    expected: Mapping[str, tuple[Sequence[int] | None, DTypeLike | None]],
    got: Mapping[str, object],
    *,
    what: str = "state dict",
) -> str | None:
    """None if `got` has exactly the names, shapes and dtypes expected, else the message.

    `expected` maps each name to `(shape, dtype)`; `None` for either accepts any.
    Values in `got` need `.shape` and `.dtype` (tensors, NumPy arrays). The message
    starts with `what` (say, the file name) and lists missing names, unexpected
    names and every mismatch (name, expected, got) together.
    """
    missing = [repr(name) for name in expected if name not in got]
    unexpected = [repr(name) for name in got if name not in expected]
    mismatched: list[str] = []
    for name, value in got.items():
        if name not in expected:
            continue
        want_shape, want_dtype = expected[name]
        shape = None if want_shape is None else tuple(int(d) for d in want_shape)
        dtype = None if want_dtype is None else np.dtype(want_dtype)
        if not (hasattr(value, "shape") and hasattr(value, "dtype")):
            mismatched.append(
                f"{name!r}: expected {_describe(shape, dtype)}, "
                f"got a {type(value).__name__}, not a tensor or array"
            )
            continue
        got_shape, got_dtype = tuple(value.shape), np.dtype(value.dtype)
        if (shape is not None and got_shape != shape) or (dtype is not None and got_dtype != dtype):
            mismatched.append(
                f"{name!r}: expected {_describe(shape, dtype)}, got {got_shape} {got_dtype}"
            )
    if not (missing or unexpected or mismatched):
        return None
    counts = [
        f"{len(items)} {label}"
        for items, label in ((missing, "missing"), (unexpected, "unexpected"),
                             (mismatched, "mismatched"))
        if items
    ]
    lines = [f"{what} does not match the expected state dict ({', '.join(counts)}):"]
    if missing:
        lines.append(f"  missing: {_listed(missing)}")
    if unexpected:
        lines.append(f"  unexpected: {_listed(unexpected)}")
    lines.extend(f"  shape/dtype mismatch: {line}" for line in mismatched[:_MAX_LISTED])
    if len(mismatched) > _MAX_LISTED:
        lines.append(f"  ... and {len(mismatched) - _MAX_LISTED} more mismatches")
    return "\n".join(lines)
