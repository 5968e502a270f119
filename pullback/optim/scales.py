"""Per-parameter learning-rate scales: a tensor's own (`set_lr_scale`) and those of
the scaling wrappers around it (`nn.LR(module, scale)`).

Every applyer multiplies a parameter's whole update by its scale: its own scale
times the `scale` of every live wrapper whose `parameters()` include it. A
wrapper's scale belongs to the wrapper, read at each update: it compounds when
wrappers nest, and stops applying when the wrapper is dropped, leaving nothing
on the parameters. Both registries are keyed by identity and forget an object
when it is collected. Neither is a `weakref.WeakKeyDictionary`: that compares
keys with `==`, and a Tensor's `==` is elementwise, so its lookups raise.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Protocol

from ..tensor import Tensor
from ._checks import real


class ScaledWrapper(Protocol):
    """What `scale_updates` registers: an object with a `scale` and the `parameters()`
    it applies to (`nn.LR`; optim sits below nn, so it names the shape, not the class)."""

    @property
    def scale(self) -> float: ...

    def parameters(self) -> Iterable[Tensor]: ...


# id(tensor) -> (weak reference whose callback drops the entry, scale)
_scales: dict[int, tuple[weakref.ref[Tensor], float]] = {}
# id(wrapper) -> weak reference whose callback drops the entry
_wrappers: dict[int, weakref.ref[ScaledWrapper]] = {}


def _forget(key: int, ref: weakref.ref[Tensor]) -> None:
    entry = _scales.get(key)
    # A newer tensor may have reused the id after this one died: drop only our own entry.
    if entry is not None and entry[0] is ref:
        del _scales[key]


def _check_param(where: str, param: object) -> Tensor:
    if not isinstance(param, Tensor):
        raise TypeError(f"{where}: expected a pullback Tensor, got {type(param).__name__}")
    return param


def set_lr_scale(param: Tensor, scale: float) -> None:
    """Make every applyer's update of `param` exactly `scale` times what it would be."""
    _check_param("set_lr_scale", param)
    scale = real("set_lr_scale", "scale", scale, low=0.0)
    key = id(param)
    if scale == 1.0:
        _scales.pop(key, None)  # 1 is the default: nothing to remember
        return
    entry = _scales.get(key)
    if entry is not None and entry[0]() is param:
        _scales[key] = (entry[0], scale)
        return
    ref = weakref.ref(param, lambda r: _forget(key, r))
    _scales[key] = (ref, scale)


def _own_scale(param: Tensor) -> float:
    entry = _scales.get(id(param))
    if entry is None or entry[0]() is not param:
        return 1.0
    return entry[1]


def lr_scale(param: Tensor) -> float:
    """The learning-rate scale of `param`: its own (1.0 unless `set_lr_scale` said
    otherwise) times that of each live wrapper around it."""
    return lr_scales([_check_param("lr_scale", param)])[0]


def scale_updates(wrapper: ScaledWrapper) -> None:
    """While `wrapper` lives, every applyer's update of each tensor in
    `wrapper.parameters()` is multiplied by `wrapper.scale`, both read at each
    update (what `nn.LR` registers itself with)."""
    key = id(wrapper)
    _wrappers[key] = weakref.ref(wrapper, lambda r: _forget_wrapper(key, r))


def _forget_wrapper(key: int, ref: weakref.ref[ScaledWrapper]) -> None:
    if _wrappers.get(key) is ref:
        del _wrappers[key]


def lr_scales(params: list[Tensor]) -> list[float]:
    """`lr_scale` of each of `params`, the wrappers' parameters gathered once."""
    wrapped: dict[int, float] = {}
    for ref in list(_wrappers.values()):  # a copy: a callback may drop an entry meanwhile
        wrapper = ref()
        if wrapper is None:
            continue
        scale = real(f"{type(wrapper).__name__}", "scale", wrapper.scale, low=0.0)
        for p in wrapper.parameters():
            wrapped[id(p)] = wrapped.get(id(p), 1.0) * scale
    if not wrapped and not _scales:
        return [1.0] * len(params)
    return [_own_scale(p) * wrapped.get(id(p), 1.0) for p in params]
