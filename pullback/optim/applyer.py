"""`GradApplyer`: what every optimizer shares.

It checks parameters and gradients, runs `TrainParams`' gradient treatments
(clip_value, clip_norm, l2, l1) and the per-parameter learning-rate scale
around a subclass's update rule, owns the step count and the per-parameter
buffers, and saves them as a flat `state_dict`. Updates are written into the
parameters' arrays in place, through reused scratch arrays, so a step makes
no large temporaries (large temporaries page-fault on every step; see
PERFORMANCE.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np

from ..tensor import Tensor
from ._checks import real
from .scales import lr_scales
from .train_params import TrainParams

# Scratch arrays per dtype, each as large as the largest parameter: the working
# gradient, and two for the rule (the last holds the update it returns).
_SCRATCH_SLOTS = 3
# As torch.nn.utils.clip_grad_norm_: keeps the coefficient finite for zero gradients.
_NORM_EPS = 1e-6


class StateDictError(KeyError, ValueError):
    """A state dict whose keys do not fit the applyer (a KeyError and a ValueError)."""

    def __str__(self) -> str:
        # KeyError would print the message in quotes, as if it were the key.
        return str(self.args[0]) if self.args else ""


def _describe(shape: tuple, dtype: Any) -> str:
    return f"{shape} {np.dtype(dtype)}"


def _check_params(where: str, params: Any) -> list[Tensor]:
    if isinstance(params, (Tensor, np.ndarray)):
        raise TypeError(
            f"{where}: params must be an iterable of Tensors (as from module.parameters()), "
            f"got a single {type(params).__name__}; wrap it in a list"
        )
    try:
        params = list(params)
    except TypeError:
        raise TypeError(
            f"{where}: params must be an iterable of Tensors, got {type(params).__name__}"
        ) from None
    if not params:
        raise ValueError(f"{where}: got an empty parameter list")
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
            raise ValueError(f"{where}: parameters {seen[id(p)]} and {i} are the same tensor")
        seen[id(p)] = i
    return params


def _as_array(where: str, what: str, value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        return value._data
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)  # what NumPy reductions return for a 0-d parameter's grad
    raise TypeError(
        f"{where}: {what} must be a Tensor or a NumPy array, got {type(value).__name__}"
    )


class GradApplyer:
    """Turns gradients into in-place parameter updates.

    `lr` is a float or a `TrainParams` (which also brings its schedule, l1, l2,
    clip_norm and clip_value). Subclasses supply `_rule`; the base class does
    everything around it.
    """

    # Set by subclasses: the coupled weight decay added to the gradient (as
    # PyTorch's SGD and Adam do), and the per-parameter buffers, by state_dict name.
    _coupled_decay: float = 0.0
    _buffer_names: tuple[str, ...] = ()
    # Buffers that are 0-d int64 counts rather than arrays shaped like the parameter.
    _count_buffers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, params: Iterable[Tensor], lr: float | TrainParams) -> None:
        where = type(self).__name__
        self.params: list[Tensor] = _check_params(where, params)
        if isinstance(lr, TrainParams):
            self.train_params = lr
        else:
            self.train_params = TrainParams(real(where, "lr", lr, low=0.0))
        self.step_count = 0
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._state: dict[int, dict[str, np.ndarray]] = {}
        self._scratch: dict[np.dtype, np.ndarray] = {}
        self._views: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}
        # Per parameter index: (kernel, the arrays it writes, its prepared launch).
        self._launches: dict[int, tuple[Any, tuple, Any]] = {}

    # ------------------------------------------------------------ the update rule

    def _rule(self, index: int, param: np.ndarray, grad: np.ndarray, lr: float, scale: float,
              tmp: np.ndarray, out: np.ndarray) -> None:
        """Update parameter `index` and its buffers in place: `param -= scale * step`,
        with `scale` its lr scale. `tmp` and `out` are scratch; `grad` must not be
        written. The float32/float64 rules do it in one fused pass."""
        raise TypeError(
            f"{type(self).__name__} has no update rule: GradApplyer is the base of SGD, "
            "RMSProp, Adam and AdamW; use one of them, or subclass it and define _rule"
        )

    def _hyper(self) -> dict[str, Any]:
        return {}

    def _fused(self, index: int, kernel: Any, args: tuple, out: tuple) -> None:
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
        """The learning rate the next step will use (the schedule applied)."""
        return self.train_params.lr_at(self.step_count)

    def zero_grad(self) -> None:
        """Forget every parameter's gradient (`p.grad = None`)."""
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """One update of every parameter whose `.grad` is not None, from those grads."""
        self._apply([(p, p.grad) for p in self.params if p.grad is not None], "step")

    def apply(self, pairs: Iterable[tuple[Tensor, Any]]) -> None:
        """One update from explicit `(param, grad)` pairs (grads as Tensors or arrays),
        leaving `.grad` alone: what `module.update(applyer, grads)` calls."""
        self._apply(pairs, "apply")

    def __repr__(self) -> str:
        hyper = "".join(f", {k}={v!r}" for k, v in self._hyper().items())
        lr = self.train_params
        lr_text = repr(lr) if lr != TrainParams(lr.lr) else repr(lr.lr)
        return f"{type(self).__name__}({len(self.params)} parameters, lr={lr_text}{hyper})"

    # ------------------------------------------------------------ one step

    @staticmethod
    def _subtract(param: np.ndarray, update: np.ndarray, scale: float) -> None:
        """`param -= scale * update`, for the NumPy rules of dtypes kernels lack."""
        if scale != 1.0:
            np.multiply(update, scale, out=update)
        np.subtract(param, update, out=param)

    def _apply(self, pairs: Iterable[tuple[Tensor, Any]], verb: str) -> None:
        where = f"{type(self).__name__}.{verb}"
        items = self._resolve(where, pairs)
        # Every check before any write, so a failed step leaves nothing half-updated.
        for _, p, _ in items:
            p._check_writeable(where)
        lr = self.train_params.lr_at(self.step_count)
        coef = self._clip_coefficient(items)
        scales = lr_scales([p for _, p, _ in items])
        for (index, p, grad), scale in zip(items, scales):
            param = p._data
            work, tmp, out = self._scratch_views(param)
            grad = self._prepare(param, grad, work, tmp, coef)
            self._rule(index, param, grad, lr, scale, tmp, out)
        self.step_count += 1

    def _resolve(self, where: str, pairs: Iterable[tuple[Tensor, Any]]
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
        coef = tp.clip_norm / (math.sqrt(total) + _NORM_EPS)
        return min(coef, 1.0)

    def _prepare(self, param: np.ndarray, grad: np.ndarray, work: np.ndarray, tmp: np.ndarray,
                 coef: float) -> np.ndarray:
        """The gradient after clip_value, clip_norm, l2, l1 and coupled weight decay:
        `grad` itself when none applies, else a treated copy in `work`."""
        tp = self.train_params
        decay = self._coupled_decay
        if tp.clip_value is None and coef == 1.0 and not tp.l2 and not tp.l1 and not decay:
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
        if decay:
            np.add(work, np.multiply(param, decay, out=tmp), out=work)
        return work

    # ------------------------------------------------------------ state

    def _new_state(self, param: np.ndarray) -> dict[str, np.ndarray]:
        """Zeroed buffers for a parameter's first step, in its dtype."""
        return {name: np.zeros((), np.int64) if name in self._count_buffers
                else np.zeros(param.shape, param.dtype) for name in self._buffer_names}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the step count ("step_count", 0-d int64) and of each stepped
        parameter's buffers ("state.<index in params>.<buffer>")."""
        out = {"step_count": np.array(self.step_count, dtype=np.int64)}
        for index in sorted(self._state):
            for name, array in self._state[index].items():
                out[f"state.{index}.{name}"] = array.copy()
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
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
        names = "|".join(map(re.escape, self._buffer_names)) or "(?!)"
        pattern = re.compile(rf"state\.(0|[1-9][0-9]*)\.({names})")
        new_state: dict[int, dict[str, np.ndarray]] = {}
        for key, value in state.items():
            if key == "step_count":
                continue
            match = pattern.fullmatch(key) if isinstance(key, str) else None
            if match is None or int(match[1]) >= len(self.params):
                raise StateDictError(
                    f"{where}: unexpected key {key!r}; expected 'step_count' and "
                    f"'state.<i>.<buffer>' with i < {len(self.params)} and buffer one of "
                    f"{list(self._buffer_names)}"
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
            missing = [n for n in self._buffer_names if n not in buffers]
            if missing:
                raise StateDictError(
                    f"{where}: parameter {index} has {sorted(buffers)} but is missing "
                    + ", ".join(repr(f"state.{index}.{n}") for n in missing)
                )
            # Buffers in _buffer_names order, as a fresh step would make them.
            new_state[index] = {n: buffers[n] for n in self._buffer_names}
        self._state = new_state
        self.step_count = int(step_count)
