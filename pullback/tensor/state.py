"""Whether eager ops record: `no_grad`, `enable_grad`, `is_grad_enabled`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any

# One flag in a list so hot code can read it without a function call.
GRAD_ENABLED = [True]


def is_grad_enabled() -> bool:
    return GRAD_ENABLED[0]


@contextmanager
def grad_mode(enabled: bool) -> Iterator[None]:
    previous = GRAD_ENABLED[0]
    GRAD_ENABLED[0] = enabled
    try:
        yield
    finally:
        GRAD_ENABLED[0] = previous


class no_grad:
    """Nothing inside records a graph; usable as a context manager or a decorator."""

    def __enter__(self) -> None:
        self._previous = GRAD_ENABLED[0]
        GRAD_ENABLED[0] = False

    def __exit__(self, *exc: Any) -> None:
        GRAD_ENABLED[0] = self._previous

    def __call__(self, fn: Callable) -> Callable:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with grad_mode(False):
                return fn(*args, **kwargs)

        return wrapper


class enable_grad(no_grad):
    """Record inside, even within `no_grad`."""

    def __enter__(self) -> None:
        self._previous = GRAD_ENABLED[0]
        GRAD_ENABLED[0] = True

    def __call__(self, fn: Callable) -> Callable:
        @wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with grad_mode(True):
                return fn(*args, **kwargs)

        return wrapper
