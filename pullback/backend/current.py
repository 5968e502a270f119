"""Which backend runs ops now: `get_backend`, `set_backend` (process-wide) and
`use_backend` (per thread)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import Backend

# The process-wide backend (`set_backend`), made on first use.
_default: list[Backend] = []
_default_lock = threading.Lock()


# This thread's innermost `use_backend` backend, None outside every block: a block in
# one thread never changes what another thread runs on (as PyTorch's per-thread modes).
# A ContextVar: each thread has its own context, and `get` is one C call, cheap enough
# for the per-op hot path.
ACTIVE: ContextVar[Backend | None] = ContextVar("pullback_backend", default=None)


def get_backend() -> Backend:
    """The backend ops run on in this thread: the innermost `use_backend` block's, else
    the process-wide one (a `CpuBackend` until `set_backend` sets another)."""
    active = ACTIVE.get()
    if active is not None:
        return active
    if not _default:
        with _default_lock:  # two threads' first ops must not make two defaults
            if not _default:
                from .cpu import CpuBackend

                _default.append(CpuBackend())
    return _default[0]


def set_backend(backend: Backend) -> None:
    """Make `backend` the one ops run on from now on, in every thread: the setting is
    process-wide. A `use_backend` block (per thread) still takes precedence inside it."""
    from .base import Backend

    if not isinstance(backend, Backend):
        raise TypeError(f"set_backend: expected a pullback Backend, got {type(backend).__name__}")
    with _default_lock:
        _default[:] = [backend]


@contextmanager
def use_backend(backend: Backend) -> Iterator[Backend]:
    """Run this thread's ops on `backend` inside the block, then restore the previous
    one; other threads are not affected."""
    from .base import Backend

    if not isinstance(backend, Backend):
        raise TypeError(f"use_backend: expected a pullback Backend, got {type(backend).__name__}")
    previous = ACTIVE.get()
    ACTIVE.set(backend)
    try:
        yield backend
    finally:
        ACTIVE.set(previous)
