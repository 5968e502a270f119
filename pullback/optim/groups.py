"""Parameter groups, as PyTorch's: the params of an applyer, split into groups that
each carry their own settings (lr, weight_decay, momentum, betas, ...).

An applyer takes an iterable of tensors (one group with the constructor's settings)
or a list of dicts, each with "params" and any of the applyer's settings; what a
group leaves out it takes from the constructor. `opt.param_groups` is that list of
dicts; a setting written into one is checked and used from the next step on. In a
state dict the groups are arrays ("param_groups.<g>.params": the flat indices of
the group's parameters; "param_groups.<g>.<setting>": its value as float64, bool,
or a float64 pair for betas), so that checkpoints, which hold arrays only, keep them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import numpy as np

from ..tensor import Tensor

GROUP_PREFIX = "param_groups."
_GROUP_KEY = re.compile(r"param_groups\.(0|[1-9][0-9]*)\.([a-z_0-9]+)")

# Checks a group's settings (a dict without "params"); returns them normalized.
CheckGroup = Callable[[str, Mapping[str, Any]], dict[str, Any]]

# What an applyer takes as `params`: tensors (`module.parameters()`), or parameter
# groups, dicts with "params" (tensors) and settings of any of the applyer's kinds.
Params = Iterable[Tensor | Mapping[str, Any]]


def _tensors(where: str, group_index: int | None, params: object) -> list[object]:
    """A group's params as a list (a lone tensor is accepted inside a group, as PyTorch)."""
    if group_index is not None and isinstance(params, Tensor):
        return [params]
    if isinstance(params, (Tensor, np.ndarray)):
        raise TypeError(
            f"{where}: params must be an iterable of Tensors (as from module.parameters()) "
            f"or a list of parameter groups (dicts), got a single {type(params).__name__}; "
            "wrap it in a list"
        )
    try:
        # Anything iterable; what is not raises TypeError here, reported below.
        return list(cast(Iterable[object], params))
    except TypeError:
        what = "params" if group_index is None else f"group {group_index}'s 'params'"
        raise TypeError(f"{where}: {what} must be an iterable of Tensors, got "
                        f"{type(params).__name__}") from None


def split_groups(where: str, params: Params, defaults: Mapping[str, Any],
                 check: CheckGroup) -> tuple[list[list[object]], list[dict[str, Any]]]:
    """The tensors and the checked settings of each group: `params` is tensors (one
    group, `defaults`, already checked) or dicts with "params" and settings overriding
    `defaults`."""
    entries = _tensors(where, None, params)
    if not any(isinstance(e, Mapping) for e in entries):
        return [entries], [dict(defaults)]
    tensors, settings = [], []
    for g, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise TypeError(f"{where}: parameter groups must all be dicts; item {g} is a "
                            f"{type(entry).__name__}")
        if "params" not in entry:
            raise ValueError(f"{where}: parameter group {g} has no 'params'")
        unknown = sorted(str(k) for k in entry if k != "params" and k not in defaults)
        if unknown:
            raise ValueError(f"{where}: parameter group {g} has unknown settings {unknown}; "
                             f"a group may set {sorted(defaults)}")
        tensors.append(_tensors(where, g, entry["params"]))
        merged = {**defaults, **{k: v for k, v in entry.items() if k != "params"}}
        settings.append(check(f"{where}: parameter group {g}", merged))
    return tensors, settings


def groups_state(groups: list[dict[str, Any]], indices: list[list[int]]
                 ) -> dict[str, np.ndarray]:
    """The groups as arrays: their parameters' flat indices and their settings."""
    out: dict[str, np.ndarray] = {}
    for g, (group, members) in enumerate(zip(groups, indices)):
        out[f"{GROUP_PREFIX}{g}.params"] = np.array(members, dtype=np.int64)
        for name, value in group.items():
            if name == "params":
                continue
            dtype = np.bool_ if isinstance(value, bool) else np.float64
            out[f"{GROUP_PREFIX}{g}.{name}"] = np.array(value, dtype=dtype)
    return out


def _decode(where: str, key: str, array: np.ndarray, default: Any) -> Any:
    """A saved setting back as the Python value it was, by the kind of its default."""
    if isinstance(default, bool):
        if array.shape != () or array.dtype != np.bool_:
            raise ValueError(f"{where}: {key!r} must be a 0-d bool array, got "
                             f"{array.shape} {array.dtype}")
        return bool(array)
    shape = (len(default),) if isinstance(default, tuple) else ()
    if array.shape != shape or array.dtype.kind != "f":
        raise ValueError(f"{where}: {key!r} must be float of shape {shape}, got "
                         f"{array.shape} {array.dtype}")
    return tuple(float(v) for v in array) if shape else float(array)


def load_groups(where: str, arrays: Mapping[str, np.ndarray], groups: list[dict[str, Any]],
                indices: list[list[int]], check: CheckGroup) -> list[dict[str, Any]] | None:
    """The settings saved for each group, checked against this applyer's groups (same
    count, same parameters); None when the state holds no groups (a state dict saved
    before applyers had groups: the current settings stay)."""
    if not arrays:
        return None
    saved: dict[int, dict[str, np.ndarray]] = {}
    for key, array in arrays.items():
        match = _GROUP_KEY.fullmatch(key)
        if match is None:
            raise ValueError(f"{where}: unexpected key {key!r}; group keys are "
                             "'param_groups.<g>.<setting>'")
        saved.setdefault(int(match[1]), {})[match[2]] = array
    if sorted(saved) != list(range(len(groups))):
        raise ValueError(f"{where}: the state dict has parameter groups {sorted(saved)}, "
                         f"this applyer {list(range(len(groups)))}")
    settings = []
    for g, (group, members) in enumerate(zip(groups, indices)):
        entry = saved[g]
        names = {k for k in group if k != "params"}
        missing = sorted((names | {"params"}) - set(entry))
        unexpected = sorted(set(entry) - names - {"params"})
        if missing or unexpected:
            raise ValueError(f"{where}: parameter group {g} lacks {missing} and has unexpected "
                             f"{unexpected}")
        params = entry["params"]
        if params.ndim != 1 or params.dtype.kind not in "iu" or params.tolist() != members:
            raise ValueError(f"{where}: parameter group {g} holds parameters "
                             f"{params.tolist()} in the state dict but {members} here")
        values = {name: _decode(where, f"{GROUP_PREFIX}{g}.{name}", entry[name], group[name])
                  for name in names}
        settings.append(check(f"{where}: parameter group {g}", values))
    return settings
