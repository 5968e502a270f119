"""Whether eager ops record: `no_grad`, `enable_grad`, `is_grad_enabled`.

Grad mode is per thread, as in PyTorch: one thread evaluating under `no_grad` does not
stop another thread's training from recording, and every new thread starts with grad
enabled.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any


class _GradMode(threading.local):
    """This thread's grad mode. `enabled` is a plain attribute so that hot code reads it
    without a function call; the class attribute is what a thread that never set it
    sees, so a new thread starts with grad enabled."""

    enabled = True


GRAD_MODE = _GradMode()


def is_grad_enabled() -> bool:
    """Whether ops on this thread record for autodiff."""
    return GRAD_MODE.enabled


@contextmanager
def grad_mode(enabled: bool) -> Iterator[None]:
    previous = GRAD_MODE.enabled
    GRAD_MODE.enabled = enabled
    try:
        yield
    finally:
        GRAD_MODE.enabled = previous


class no_grad:
    """Nothing inside records a graph; usable as a context manager or a decorator."""

    def __enter__(self) -> None:
        self._previous = GRAD_MODE.enabled
        GRAD_MODE.enabled = False

    def __exit__(self, *exc: Any) -> None:
        GRAD_MODE.enabled = self._previous

    def __call__(self, fn: Callable) -> Callable:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with grad_mode(False):
                return fn(*args, **kwargs)

        return wrapper


class enable_grad(no_grad):
    """Record inside, even within `no_grad`."""

    def __enter__(self) -> None:
        self._previous = GRAD_MODE.enabled
        GRAD_MODE.enabled = True

    def __call__(self, fn: Callable) -> Callable:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with grad_mode(True):
                return fn(*args, **kwargs)

        return wrapper
