"""`GradApplyer`: what every optimizer shares.

It checks parameters and gradients, keeps them in parameter groups (groups.py),
runs `TrainParams`' gradient treatments (clip_value, clip_norm, l2, l1) and the
per-parameter learning-rate scale around a subclass's update rule, owns the step
count and the per-parameter buffers, and saves them with the groups as a flat
`state_dict`.

A group's "lr" is its base rate: the `TrainParams` schedule, if any, multiplies
every group's at each step (`factor_at(step)`, as torch's LambdaLR), so
`param_groups[i]["lr"] = x` rescales that group from the next step on and the
schedule keeps running.

Updates are written into the parameters' arrays in place, through reused scratch
arrays, so a step makes no large temporaries (large temporaries page-fault on
every step; see PERFORMANCE.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Generic, TypeVar, cast, overload

import numpy as np
from numpy.typing import DTypeLike, NDArray

from ..kernels.elementwise import ElementwiseKernel
from ..tensor import Tensor
from ._checks import real
from .clip import NORM_EPS
from .groups import GROUP_PREFIX, Params, groups_state, load_groups, split_groups
from .scales import lr_scales
from .train_params import TrainParams

# Scratch arrays per dtype, each as large as the largest parameter: the working
# gradient, and two for the rule (the last holds the update it returns).
_SCRATCH_SLOTS = 3

# A gradient as `apply` and `load_state_dict` take it: a Tensor or a NumPy array.
GradLike = Tensor | NDArray[Any]

_T = TypeVar("_T")


class StateDictError(KeyError, ValueError):
    """A state dict whose keys do not fit the applyer (a KeyError and a ValueError)."""

    def __str__(self) -> str:
        # KeyError would print the message in quotes, as if it were the key.
        return str(self.args[0]) if self.args else ""


def _describe(shape: tuple[int, ...], dtype: DTypeLike) -> str:
    return f"{shape} {np.dtype(dtype)}"


def _check_params(where: str, params: list[object]) -> list[Tensor]:
    if not params:
        raise ValueError(f"{where}: got an empty parameter list")
    checked: list[Tensor] = []
    seen: dict[int, int] = {}
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"{where}: parameter {i} is a {type(p).__name__}, not a Tensor")
        if p.dtype.kind != "f":
            raise TypeError(
                f"{where}: parameter {i} ({_describe(p.shape, p.dtype)}) is not floating point"
            )
        if not p.is_leaf:
            raise ValueError(
                f"{where}: parameter {i} ({_describe(p.shape, p.dtype)}) is computed from other "
                "tensors; only leaf tensors can be optimized"
            )
        # By identity: a Tensor's == is elementwise, so `p in list` would not work.
        if id(p) in seen:
            raise ValueError(f"{where}: parameters {seen[id(p)]} and {i} are the same tensor "
                             "(a parameter may be in one group only, once)")
        seen[id(p)] = i
        checked.append(p)
    return checked


def _as_array(where: str, what: str, value: object) -> np.ndarray:
    if isinstance(value, Tensor):
        return value._data
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)  # what NumPy reductions return for a 0-d parameter's grad
    raise TypeError(
        f"{where}: {what} must be a Tensor or a NumPy array, got {type(value).__name__}"
    )


class _Default(Generic[_T]):
    """A constructor setting, read as `opt.momentum`: the default of parameter groups
    that do not set their own. Not assignable: the groups hold what steps use.
    `_Default[float]()` reads as a float."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, opt: None, owner: type | None = None) -> _Default[_T]: ...

    @overload
    def __get__(self, opt: GradApplyer, owner: type | None = None) -> _T: ...

    def __get__(self, opt: GradApplyer | None, owner: type | None = None
                ) -> _Default[_T] | _T:
        # The setting as the group check normalized it (real() floats, a bool, a pair).
        return self if opt is None else cast(_T, opt.defaults[self.name])

    def __set__(self, opt: GradApplyer, value: object) -> None:
        raise AttributeError(
            f"{type(opt).__name__}.{self.name} is the default of parameter groups; set "
            f"opt.param_groups[i][{self.name!r}] to change what the next step uses"
        )


class GradApplyer:
    """Turns gradients into in-place parameter updates.

    `params` is an iterable of tensors, or PyTorch's list of parameter groups (dicts
    with "params" and settings that override the constructor's). `lr` is a float or a
    `TrainParams` (which also brings its schedule, l1, l2, clip_norm and clip_value,
    for all groups). Subclasses supply `_check_group`, `_buffers_for` and `_rule`; the
    base class does everything around them.
    """

    # Set by subclasses: every per-parameter buffer a rule may keep, by state_dict name.
    _buffer_names: ClassVar[tuple[str, ...]] = ()
    # Buffers that are 0-d int64 counts rather than arrays shaped like the parameter.
    _count_buffers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, params: Params, lr: float | TrainParams, **settings: Any) -> None:
        where = type(self).__name__
        if isinstance(lr, TrainParams):
            self.train_params = lr
        else:
            self.train_params = TrainParams(real(where, "lr", lr, low=0.0))
        self.defaults: dict[str, Any] = self._check_group(
            where, {"lr": self.train_params.lr, **settings})
        tensors, groups = split_groups(where, params, self.defaults, self._check_group)
        self.params: list[Tensor] = _check_params(where, [p for ts in tensors for p in ts])
        self.param_groups: list[dict[str, Any]] = [
            {"params": ts, **group} for ts, group in zip(tensors, groups)]
        self._group_of = [g for g, ts in enumerate(tensors) for _ in ts]
        self._group_indices: list[list[int]] = []
        first = 0
        for ts in tensors:
            self._group_indices.append(list(range(first, first + len(ts))))
            first += len(ts)
        self.step_count = 0
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._state: dict[int, dict[str, np.ndarray]] = {}
        self._scratch: dict[np.dtype[Any], np.ndarray] = {}
        self._views: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}
        # Per parameter index: (kernel, the arrays it writes, its prepared launch).
        self._launches: dict[int, tuple[ElementwiseKernel, tuple[np.ndarray, ...],
                                        Callable[..., object] | None]] = {}

    # ------------------------------------------------------------ the update rule

    def _rule(self, index: int, param: np.ndarray, grad: np.ndarray, lr: float, scale: float,
              tmp: np.ndarray, out: np.ndarray, group: dict[str, Any]) -> None:
        """Update parameter `index` and its buffers in place: `param -= scale * step`,
        with `scale` its lr scale and `group` its group's checked settings. `tmp` and
        `out` are scratch; `grad` must not be written. The float32/float64 rules do it
        in one fused pass."""
        raise TypeError(
            f"{type(self).__name__} has no update rule: GradApplyer is the base of SGD, "
            "RMSProp, Adam and AdamW; use one of them, or subclass it and define _rule"
        )

    @staticmethod
    def _check_group(where: str, group: Mapping[str, Any]) -> dict[str, Any]:
        """A group's settings (a dict without "params") checked and normalized; `where`
        names the applyer and the group in errors."""
        return {"lr": real(where, "lr", group["lr"], low=0.0)}

    def _buffers_for(self, group: Mapping[str, Any]) -> tuple[str, ...]:
        """The buffers a parameter of a group with these settings must have once stepped."""
        return self._buffer_names

    def _settings(self, where: str) -> list[dict[str, Any]]:
        """Each group's settings as this step uses them: checked (a setting written into
        `param_groups` is checked here), "lr" with the schedule's factor applied."""
        factor = self.train_params.factor_at(self.step_count)
        settings = []
        for g, group in enumerate(self.param_groups):
            missing = [k for k in self.defaults if k not in group]
            if missing:
                raise KeyError(f"{where}: parameter group {g} lost its settings {missing}")
            checked = self._check_group(f"{where}: parameter group {g}", group)
            checked["lr"] = checked["lr"] * factor if factor != 1.0 else checked["lr"]
            settings.append(checked)
        return settings

    def _fused(self, index: int, kernel: ElementwiseKernel, args: tuple[object, ...],
               out: tuple[np.ndarray, ...]) -> None:
        """`kernel(*args, out=out)`, the outputs being inputs (the parameter and its
        buffers), through a launch prepared at the parameter's first step: the
        general call's checks cost more than the loop itself on small parameters."""
        cached = self._launches.get(index)
        if cached is None or cached[0] is not kernel or any(
                a is not b for a, b in zip(cached[1], out)):
            cached = self._launches[index] = (kernel, out, kernel.in_place(args, out))
        launch = cached[2]
        if launch is None:
            kernel(*args, out=out)
        else:
            launch(*args)

    # ------------------------------------------------------------ public API

    @property
    def lr(self) -> float:
        """The learning rate the next step will use for the first group (the schedule
        applied); each group's base rate is `param_groups[i]["lr"]`."""
        return float(self._settings(type(self).__name__)[0]["lr"])

    def zero_grad(self) -> None:
        """Forget every parameter's gradient (`p.grad = None`)."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """One update of every parameter whose `.grad` is not None, from those grads."""
        self._apply([(p, p.grad) for p in self.params if p.grad is not None], "step")

    def apply(self, pairs: Iterable[tuple[Tensor, GradLike]]) -> None:
        """One update from explicit `(param, grad)` pairs (grads as Tensors or arrays),
        leaving `.grad` alone: what `module.update(applyer, grads)` calls."""
        self._apply(pairs, "apply")

    def __repr__(self) -> str:
        hyper = "".join(f", {k}={v!r}" for k, v in self.defaults.items() if k != "lr")
        lr = self.train_params
        lr_text = repr(lr) if lr != TrainParams(lr.lr) else repr(lr.lr)
        count = f"{len(self.params)} parameters"
        if len(self.param_groups) > 1:
            count += f" in {len(self.param_groups)} groups"
            groups = ", ".join(
                "{" + ", ".join([f"{len(group['params'])} parameters"] + [
                    f"{k}={v!r}" for k, v in group.items()
                    if k != "params" and v != self.defaults.get(k)]) + "}"
                for group in self.param_groups)
            hyper += f", groups=[{groups}]"
        return f"{type(self).__name__}({count}, lr={lr_text}{hyper})"

    # ------------------------------------------------------------ one step

    @staticmethod
    def _subtract(param: np.ndarray, update: np.ndarray, scale: float) -> None:
        """`param -= scale * update`, for the NumPy rules of dtypes kernels lack."""
        if scale != 1.0:
            np.multiply(update, scale, out=update)
        np.subtract(param, update, out=param)

    def _apply(self, pairs: Iterable[tuple[Tensor, GradLike]], verb: str) -> None:
        where = f"{type(self).__name__}.{verb}"
        items = self._resolve(where, pairs)
        # Every check before any write, so a failed step leaves nothing half-updated.
        for _, p, _ in items:
            p._check_writeable(where)
        settings = self._settings(where)
        coef = self._clip_coefficient(items)
        scales = lr_scales([p for _, p, _ in items])
        for (index, p, grad), scale in zip(items, scales):
            param = p._data
            group = settings[self._group_of[index]]
            self._follow_dtype(index, param)
            work, tmp, out = self._scratch_views(param)
            grad = self._prepare(param, grad, work, tmp, coef)
            self._rule(index, param, grad, group["lr"], scale, tmp, out, group)
        self.step_count += 1

    def _follow_dtype(self, index: int, param: np.ndarray) -> None:
        """A parameter converted to another float dtype (`module.to(dtype)`) takes its
        buffers along, as PyTorch's load_state_dict casts them to the parameter's."""
        state = self._state.get(index)
        if state is None:
            return
        for name, array in state.items():
            if array.dtype != param.dtype and name not in self._count_buffers:
                state[name] = array.astype(param.dtype)

    def _resolve(self, where: str, pairs: Iterable[tuple[Tensor, GradLike]]
                 ) -> list[tuple[int, Tensor, np.ndarray]]:
        items = []
        seen = set()
        for entry in pairs:
            try:
                p, g = entry
            except (TypeError, ValueError):
                raise TypeError(f"{where}: expected (param, grad) pairs, got {entry!r}") from None
            index = self._index.get(id(p)) if isinstance(p, Tensor) else None
            if index is None or self.params[index] is not p:
                what = _describe(p.shape, p.dtype) if isinstance(p, Tensor) else type(p).__name__
                raise ValueError(f"{where}: parameter {what} is not one of this applyer's params")
            if index in seen:
                raise ValueError(f"{where}: parameter {index} appears twice in one step")
            seen.add(index)
            grad = _as_array(where, f"the gradient of parameter {index}", g)
            if grad.shape != p.shape or grad.dtype != p.dtype:
                raise ValueError(
                    f"{where}: the gradient of parameter {index} is "
                    f"{_describe(grad.shape, grad.dtype)} but the parameter is "
                    f"{_describe(p.shape, p.dtype)}"
                )
            items.append((index, p, grad))
        return items

    def _scratch_views(self, param: np.ndarray) -> list[np.ndarray]:
        cached = self._views.get(id(param))
        if cached is not None and cached[0] is param:
            return cached[1]
        buf = self._scratch.get(param.dtype)
        if buf is None or buf.size < _SCRATCH_SLOTS * param.size:
            # Sized once, for the largest parameter of this dtype; every step reuses it.
            largest = max([p.size for p in self.params if p.dtype == param.dtype] + [param.size])
            buf = np.empty(_SCRATCH_SLOTS * largest, dtype=param.dtype)
            self._scratch[param.dtype] = buf
            self._views.clear()
        cap, n = buf.size // _SCRATCH_SLOTS, param.size
        views = [buf[k * cap:k * cap + n].reshape(param.shape) for k in range(_SCRATCH_SLOTS)]
        self._views[id(param)] = (param, views)
        return views

    def _clip_coefficient(self, items: list[tuple[int, Tensor, np.ndarray]]) -> float:
        """The factor on every gradient of this step that keeps their global norm
        within clip_norm (after clip_value), as torch.nn.utils.clip_grad_norm_."""
        tp = self.train_params
        if tp.clip_norm is None or not items:
            return 1.0
        total = 0.0
        for _, p, grad in items:
            work = self._scratch_views(p._data)[0]
            if tp.clip_value is not None:
                grad = np.clip(grad, -tp.clip_value, tp.clip_value, out=work)
            elif not grad.flags.c_contiguous:
                np.copyto(work, grad)  # reshape(-1) below would copy it otherwise
                grad = work
            flat = grad.reshape(-1)
            total += float(np.dot(flat, flat))
        coef = tp.clip_norm / (math.sqrt(total) + NORM_EPS)
        return min(coef, 1.0)

    def _prepare(self, param: np.ndarray, grad: np.ndarray, work: np.ndarray, tmp: np.ndarray,
                 coef: float) -> np.ndarray:
        """The gradient after clip_value, clip_norm, l2 and l1 (each applyer's own weight
        decay is part of its rule): `grad` itself when none applies, else a treated copy
        in `work`."""
        tp = self.train_params
        if tp.clip_value is None and coef == 1.0 and not tp.l2 and not tp.l1:
            return grad
        if tp.clip_value is not None:
            np.clip(grad, -tp.clip_value, tp.clip_value, out=work)
        else:
            np.copyto(work, grad)
        if coef != 1.0:
            np.multiply(work, coef, out=work)
        if tp.l2:
            np.add(work, np.multiply(param, tp.l2, out=tmp), out=work)
        if tp.l1:
            np.sign(param, out=tmp)
            np.add(work, np.multiply(tmp, tp.l1, out=tmp), out=work)
        return work

    # ------------------------------------------------------------ state

    def _state_of(self, index: int, param: np.ndarray, names: tuple[str, ...]
                  ) -> dict[str, np.ndarray]:
        """Parameter `index`'s buffers, with zeroed ones (in its dtype) for any of `names`
        it does not have yet: all at its first step, or one its group's new settings
        need (momentum turned on)."""
        state = self._state.setdefault(index, {})
        for name in names:
            if name not in state:
                state[name] = np.zeros((), np.int64) if name in self._count_buffers \
                    else np.zeros(param.shape, param.dtype)
        return state

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the step count ("step_count", 0-d int64), of each stepped
        parameter's buffers ("state.<index in params>.<buffer>") and of the groups
        ("param_groups.<g>.params", "param_groups.<g>.<setting>"; see groups.py)."""
        out = {"step_count": np.array(self.step_count, dtype=np.int64)}
        for index in sorted(self._state):
            for name, array in self._state[index].items():
                out[f"state.{index}.{name}"] = array.copy()
        out.update(groups_state(self.param_groups, self._group_indices))
        return out

    def load_state_dict(self, state: Mapping[str, GradLike]) -> None:
        """Restore what `state_dict` saved (arrays or Tensors); checks every key and shape,
        and changes nothing unless all fit."""
        where = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state, Mapping):
            raise TypeError(f"{where}: expected a dict of arrays, got {type(state).__name__}")
        if "step_count" not in state:
            raise StateDictError(f"{where}: missing key 'step_count'")
        step_count = _as_array(where, "'step_count'", state["step_count"])
        if step_count.shape != () or step_count.dtype.kind not in "iu" or step_count < 0:
            raise ValueError(f"{where}: 'step_count' must be a 0-d integer array >= 0, got "
                             f"{_describe(step_count.shape, step_count.dtype)} {step_count!r}")
        group_arrays = {key: _as_array(where, repr(key), value) for key, value in state.items()
                        if isinstance(key, str) and key.startswith(GROUP_PREFIX)}
        groups = load_groups(where, group_arrays, self.param_groups, self._group_indices,
                             self._check_group)
        settings = groups if groups is not None else [
            self._check_group(where, g) for g in self.param_groups]
        names = "|".join(map(re.escape, self._buffer_names)) or "(?!)"
        pattern = re.compile(rf"state\.(0|[1-9][0-9]*)\.({names})")
        new_state: dict[int, dict[str, np.ndarray]] = {}
        for key, value in state.items():
            if key == "step_count" or key in group_arrays:
                continue
            match = pattern.fullmatch(key) if isinstance(key, str) else None
            if match is None or int(match[1]) >= len(self.params):
                raise StateDictError(
                    f"{where}: unexpected key {key!r}; expected 'step_count' and "
                    f"'state.<i>.<buffer>' with i < {len(self.params)} and buffer one of "
                    f"{list(self._buffer_names)}, and 'param_groups.<g>.<setting>'"
                )
            index, name = int(match[1]), match[2]
            array = _as_array(where, repr(key), value)
            param = self.params[index]
            is_count = name in self._count_buffers
            shape = () if is_count else param.shape
            kind = "iu" if is_count else "f"
            if array.shape != shape or array.dtype.kind not in kind:
                raise ValueError(
                    f"{where}: {key!r} is {_describe(array.shape, array.dtype)} but parameter "
                    f"{index} ({_describe(param.shape, param.dtype)}) needs "
                    f"{'a 0-d integer count' if is_count else 'floats of shape ' + str(shape)}"
                )
            dtype = np.int64 if is_count else param.dtype
            new_state.setdefault(index, {})[name] = np.array(array, dtype=dtype, order="C")
        for index, buffers in new_state.items():
            needed = self._buffers_for(settings[self._group_of[index]])
            missing = [n for n in needed if n not in buffers]
            if missing:
                raise StateDictError(
                    f"{where}: parameter {index} has {sorted(buffers)} but is missing "
                    + ", ".join(repr(f"state.{index}.{n}") for n in missing)
                )
            # Buffers in _buffer_names order, as a fresh step would make them.
            new_state[index] = {n: buffers[n] for n in self._buffer_names if n in buffers}
        self._state = new_state
        self.step_count = int(step_count)
        if groups is not None:
            for group, loaded in zip(self.param_groups, groups):
                group.update(loaded)
