"""Per-parameter learning-rate scales (what `nn.LR(module, scale)` sets).

Every applyer multiplies a parameter's whole update by its scale. The registry
is keyed by the tensor's identity and forgets a tensor when it is collected. It
is not a `weakref.WeakKeyDictionary`: that compares keys with `==`, and a
Tensor's `==` is elementwise, so its lookups raise.
"""

from __future__ import annotations

import weakref

from ..tensor import Tensor
from ._checks import real

# id(tensor) -> (weak reference whose callback drops the entry, scale)
_scales: dict[int, tuple[weakref.ref, float]] = {}


def _forget(key: int, ref: weakref.ref) -> None:
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
    ref = weakref.ref(param, lambda r, key=key: _forget(key, r))
    _scales[key] = (ref, scale)


def lr_scale(param: Tensor) -> float:
    """The learning-rate scale of `param` (1.0 unless `set_lr_scale` said otherwise)."""
    entry = _scales.get(id(_check_param("lr_scale", param)))
    if entry is None or entry[0]() is not param:
        return 1.0
    return entry[1]
