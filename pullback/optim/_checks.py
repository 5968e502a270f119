"""Argument checks shared by the schedules, `TrainParams` and the applyers.

Each returns the value as a plain Python number, so NumPy scalars (float64 in
particular) never reach the f32 update arithmetic.
"""

from __future__ import annotations

import math
import numbers


def real(where: str, name: str, value: object, *, low: float | None = None,
         low_open: bool = False, high: float | None = None, high_open: bool = False) -> float:
    """`value` as a finite float within [low, high] (an end is excluded when `*_open`)."""
    # bool is a Real to Python, but `lr=True` is surely a mistake.
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    result = float(value) if ok else math.nan  # type: ignore[arg-type]
    ok = ok and math.isfinite(result)
    if ok and low is not None:
        ok = result > low if low_open else result >= low
    if ok and high is not None:
        ok = result < high if high_open else result <= high
    if not ok:
        bounds = []
        if low is not None:
            bounds.append(f"{'>' if low_open else '>='} {low:g}")
        if high is not None:
            bounds.append(f"{'<' if high_open else '<='} {high:g}")
        rule = " and ".join(bounds)
        raise ValueError(
            f"{where}: {name} must be a finite number{' ' + rule if rule else ''}, got {value!r}"
        )
    return result


def count(where: str, name: str, value: object, low: int = 0) -> int:
    """`value` as an int >= low."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{where}: {name} must be an integer >= {low}, got {value!r}")
    return int(value)
