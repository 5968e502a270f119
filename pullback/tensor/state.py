"""Whether eager ops record: `no_grad`, `enable_grad`, `is_grad_enabled`.

Grad mode is per thread, as in PyTorch: one thread evaluating under `no_grad` does not
stop another thread's training from recording, and every new thread starts with grad
enabled. It lives in a `ContextVar`: each thread has its own context (an asyncio task
its own copy), and `ContextVar.get` is one C call, cheaper on the per-op hot path than
a `threading.local` attribute.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import wraps
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")

GRAD_ENABLED: ContextVar[bool] = ContextVar("pullback_grad_enabled", default=True)
# Hot code calls this bound method directly: one call, no attribute lookup.
grad_enabled = GRAD_ENABLED.get


def is_grad_enabled() -> bool:
    """Whether ops on this thread record for autodiff."""
    return GRAD_ENABLED.get()


@contextmanager
def grad_mode(enabled: bool) -> Iterator[None]:
    previous = GRAD_ENABLED.get()
    GRAD_ENABLED.set(enabled)
    try:
        yield
    finally:
        GRAD_ENABLED.set(previous)


class no_grad:
    """Nothing inside records a graph; usable as a context manager or a decorator."""

    def __enter__(self) -> None:
        self._previous = GRAD_ENABLED.get()
        GRAD_ENABLED.set(False)

    def __exit__(self, *exc: object) -> None:
        GRAD_ENABLED.set(self._previous)

    def __call__(self, fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @wraps(fn)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with grad_mode(False):
                return fn(*args, **kwargs)

        return wrapper


class enable_grad(no_grad):
    """Record inside, even within `no_grad`."""

    def __enter__(self) -> None:
        self._previous = GRAD_ENABLED.get()
        GRAD_ENABLED.set(True)

    def __call__(self, fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @wraps(fn)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with grad_mode(True):
                return fn(*args, **kwargs)

        return wrapper
