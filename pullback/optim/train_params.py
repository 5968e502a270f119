"""`TrainParams`: the learning rate, its schedule, and the gradient treatments
(clipping, L1/L2 penalties) that every applyer runs before its own rule."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._checks import count, real
from .schedules import Schedule


@dataclass(frozen=True)
class TrainParams:
    """How gradients become updates, whatever the applyer.

    Per step, in this order: clip each gradient to [-clip_value, clip_value];
    scale all of the step's gradients together so their global L2 norm is at most
    `clip_norm`; add `l2 * param`; add `l1 * sign(param)`; then the applyer's rule
    with learning rate `lr_at(step)`. `schedule` maps the step (0 for the first
    update) to a factor on `lr`. Frozen: change one with `dataclasses.replace`.
    """

    lr: float
    l1: float = 0.0
    l2: float = 0.0
    clip_norm: float | None = None
    clip_value: float | None = None
    schedule: Schedule | None = None

    def __post_init__(self) -> None:
        where = "TrainParams"
        # Frozen: the checked, normalized values are stored through object.__setattr__.
        object.__setattr__(self, "lr", real(where, "lr", self.lr, low=0.0))
        object.__setattr__(self, "l1", real(where, "l1", self.l1, low=0.0))
        object.__setattr__(self, "l2", real(where, "l2", self.l2, low=0.0))
        for name in ("clip_norm", "clip_value"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, real(where, name, value, low=0.0, low_open=True))
        if self.schedule is not None and not callable(self.schedule):
            raise TypeError(
                f"TrainParams: schedule must be a callable step -> factor or None, "
                f"got {self.schedule!r}"
            )

    def lr_at(self, step: int) -> float:
        """The learning rate of update number `step` (counted from 0)."""
        factor = self._factor("TrainParams.lr_at", step)
        return self.lr * factor if self.schedule is not None else self.lr

    def factor_at(self, step: int) -> float:
        """The schedule's factor on the learning rate at update number `step` (1 without
        a schedule); an applyer multiplies each parameter group's lr by it."""
        return self._factor("TrainParams.factor_at", step)

    def _factor(self, where: str, step: int) -> float:
        step = count(where, "step", step)
        if self.schedule is None:
            return 1.0
        factor = self.schedule(step)
        try:
            factor = float(factor)
        except (TypeError, ValueError):
            factor = math.nan
        if not (math.isfinite(factor) and factor >= 0.0):
            raise ValueError(
                f"{where}: schedule {self.schedule!r} gave factor {factor!r} at step "
                f"{step}; a factor must be a finite number >= 0"
            )
        return factor
