"""Gradient-ready hooks: callbacks that a TRAINING plan and eager `backward()` call the
moment a parameter's gradient is final, while the rest of the backward still runs.

This is how work on a gradient can start before the backward is over: data-parallel
training (`pullback.distributed.DistributedOptimizer`) starts the allreduce of a
bucket of gradients as soon as the bucket's last gradient is ready, so communication
overlaps the rest of the backward. A hook receives the parameter (its `.grad` already
holds the gradient, accumulated as `loss.backward()` would); it must not change the
gradient's value. Hooks run in the order they were registered, on every training plan
and every eager backward that is not itself recorded (`create_graph=True` calls none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .eager import Tensor

# `hook(param)`: called with the parameter whose `.grad` is final.
GradientHook = Callable[["Tensor"], None]

_hooks: list[GradientHook] = []


class HookHandle:
    """What `on_gradient_ready` returns: `remove()` unregisters the hook (once is enough)."""

    def __init__(self, hook: GradientHook) -> None:
        self._hook = hook

    def remove(self) -> None:
        if self._hook in _hooks:
            _hooks.remove(self._hook)


def on_gradient_ready(hook: GradientHook) -> HookHandle:
    """Call `hook(param)` whenever a backward has finished a parameter's gradient."""
    if not callable(hook):
        raise TypeError(f"on_gradient_ready: expected a callable, got {type(hook).__name__}")
    _hooks.append(hook)
    return HookHandle(hook)


def active() -> bool:
    """Whether any hook is registered (a backward without hooks skips the calls)."""
    return bool(_hooks)


def gradient_ready(param: Tensor) -> None:
    """Tell every hook that `param.grad` is final for this backward."""
    for hook in list(_hooks):
        hook(param)
