"""Learning-rate schedules: small callables mapping a step (counted from 0) to a factor.

`TrainParams.lr_at(step)` multiplies its `lr` by the factor. Each schedule is a
frozen dataclass so it compares by value and prints as the call that built it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ._checks import count, real

Schedule = Callable[[int], float]


def _check_step(where: str, step: object) -> int:
    return count(where, "the step", step)


@dataclass(frozen=True)
class Constant:
    """Factor 1 at every step."""

    def __call__(self, step: int) -> float:
        _check_step("constant", step)
        return 1.0

    def __repr__(self) -> str:
        return "constant()"


@dataclass(frozen=True)
class StepDecay:
    """`gamma ** (step // step_size)`, as torch's StepLR."""

    step_size: int
    gamma: float = 0.1

    def __post_init__(self) -> None:
        # Frozen: the checked, normalized values are stored through object.__setattr__.
        object.__setattr__(self, "step_size", count("step_decay", "step_size", self.step_size, 1))
        object.__setattr__(self, "gamma", real("step_decay", "gamma", self.gamma, low=0.0))

    def __call__(self, step: int) -> float:
        return self.gamma ** (_check_step("step_decay", step) // self.step_size)

    def __repr__(self) -> str:
        return f"step_decay({self.step_size}, gamma={self.gamma!r})"


@dataclass(frozen=True)
class Cosine:
    """Half a cosine from 1 down to `min_factor` over `total_steps` steps, as torch's
    CosineAnnealingLR (T_max=total_steps, eta_min=min_factor*lr) stepped once per update.

    Past `total_steps` the factor rises again along the same cosine, as torch's does;
    size `total_steps` to the whole run.
    """

    total_steps: int
    min_factor: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "total_steps",
                           count("cosine", "total_steps", self.total_steps, 1))
        object.__setattr__(self, "min_factor",
                           real("cosine", "min_factor", self.min_factor, low=0.0, high=1.0))

    def __call__(self, step: int) -> float:
        step = _check_step("cosine", step)
        low = self.min_factor
        return low + (1.0 - low) * (1.0 + math.cos(math.pi * step / self.total_steps)) / 2.0

    def __repr__(self) -> str:
        return f"cosine({self.total_steps}, min_factor={self.min_factor!r})"


@dataclass(frozen=True)
class LinearWarmup:
    """`(step + 1) / warmup_steps` over the first `warmup_steps` steps, then `then`
    shifted by `warmup_steps` (or 1 when `then` is None)."""

    warmup_steps: int
    then: Schedule | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "warmup_steps",
                           count("linear_warmup", "warmup_steps", self.warmup_steps, 0))
        if self.then is not None and not callable(self.then):
            raise TypeError(
                f"linear_warmup: then must be a schedule (a callable step -> factor) or None, "
                f"got {self.then!r}"
            )

    def __call__(self, step: int) -> float:
        step = _check_step("linear_warmup", step)
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        return 1.0 if self.then is None else float(self.then(step - self.warmup_steps))

    def __repr__(self) -> str:
        then = "" if self.then is None else f", then={self.then!r}"
        return f"linear_warmup({self.warmup_steps}{then})"


def constant() -> Constant:
    """Factor 1 at every step."""
    return Constant()


def step_decay(step_size: int, gamma: float = 0.1) -> StepDecay:
    """Multiply the factor by `gamma` every `step_size` steps (torch's StepLR)."""
    return StepDecay(step_size, gamma)


def cosine(total_steps: int, min_factor: float = 0.0) -> Cosine:
    """Cosine annealing from 1 to `min_factor` over `total_steps` (torch's CosineAnnealingLR)."""
    return Cosine(total_steps, min_factor)


def linear_warmup(warmup_steps: int, then: Schedule | None = None) -> LinearWarmup:
    """Linear warm-up to 1 over `warmup_steps` steps, then `then` (shifted) or 1."""
    return LinearWarmup(warmup_steps, then)
