"""Which backend runs ops now: `get_backend`, `set_backend`, `use_backend`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_current: list[Any] = []


def get_backend() -> Any:
    """The backend ops run on; a `CpuBackend` until another is set."""
    if not _current:
        from .cpu import CpuBackend

        _current.append(CpuBackend())
    return _current[-1]


def set_backend(backend: Any) -> None:
    """Make `backend` the one ops run on from now on."""
    from .base import Backend

    if not isinstance(backend, Backend):
        raise TypeError(f"set_backend: expected a pullback Backend, got {type(backend).__name__}")
    if _current:
        _current[-1] = backend
    else:
        _current.append(backend)


@contextmanager
def use_backend(backend: Any) -> Iterator[Any]:
    """Run ops on `backend` inside the block, then restore the previous one."""
    from .base import Backend

    if not isinstance(backend, Backend):
        raise TypeError(f"use_backend: expected a pullback Backend, got {type(backend).__name__}")
    get_backend()
    _current.append(backend)
    try:
        yield backend
    finally:
        _current.pop()
