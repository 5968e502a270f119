"""The one error type of the io layer.

A `CheckpointError` is a `ValueError`, so callers that already catch bad values
catch bad checkpoints too; its message names the file (or what was checked).
"""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint that cannot be written, read, or matched against a model."""
