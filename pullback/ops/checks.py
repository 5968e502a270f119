"""How `pullback check` checks a primitive: the `Spec` each op file registers on its
primitives with `declare_check`, and the samplers that draw a spec's inputs.

A spec names how to apply the primitive (through its public function) and how to
draw its inputs: shapes that broadcast for binary ops, domains where the op is smooth
(log on positives, no ties for max, clip away from its bounds). Samplers draw
float64; the check casts floating inputs to the dtype it checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..ad import Primitive

Sampler = Callable[[np.random.Generator], np.ndarray]
#: Draws all of a spec's inputs.
Sample = Callable[[np.random.Generator], tuple[np.ndarray, ...]]


@dataclass(frozen=True)
class Spec:
    """How to check one primitive.

    `fn` applies it to the sampled inputs (it may return a tuple, to cover
    several parameter settings at once); `sample` draws the inputs; `order` is
    the highest derivative to check (2: the derivative of the vjp too);
    `reference`, for primitives without a gradient, is NumPy's forward.
    """

    fn: Callable[..., Any]
    sample: Sample
    order: int = 2
    reference: Callable[..., Any] | None = None


def declare_check(prim: Primitive, fn: Callable[..., Any],
                  sample: Sample, *,
                  order: int = 2, reference: Callable[..., Any] | None = None) -> None:
    """Declare how `pullback check` checks `prim` (see `Spec`)."""
    if order not in (1, 2):
        raise ValueError(f"{prim.name}: a check's order is 1 or 2, not {order!r}")
    if not prim.differentiable and reference is None:
        raise ValueError(f"{prim.name} has no gradient: its check needs NumPy's forward "
                         "as the reference")
    prim.check = Spec(fn, sample, order, reference)


def inputs(*samplers: Sampler) -> Sample:
    return lambda rng: tuple(s(rng) for s in samplers)


def normal(*shape: int) -> Sampler:
    return lambda rng: rng.standard_normal(shape)


def labels(classes: int, *shape: int) -> Sampler:
    """Integer class labels: an operand that is never differentiated."""
    return lambda rng: rng.integers(0, classes, shape)


def positive(*shape: int) -> Sampler:
    return lambda rng: rng.uniform(0.5, 2.0, shape)


def nonzero(*shape: int) -> Sampler:
    """Away from 0, where abs, relu and sign have kinks."""
    return lambda rng: rng.choice((-1.0, 1.0), shape) * rng.uniform(0.2, 1.5, shape)


def distinct(*shape: int) -> Sampler:
    """No two values within 0.02 of each other: no ties for max and max_pool2d."""
    size = int(np.prod(shape))
    return lambda rng: (rng.permutation(size).reshape(shape) - size / 2) * 0.05


def constant(value: ArrayLike) -> Sampler:
    return lambda rng: np.asarray(value)


def separated(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> Sample:
    """a and b at least 0.2 apart everywhere: maximum and minimum have no ties."""

    def sample(rng: np.random.Generator) -> tuple[np.ndarray, ...]:
        b = rng.standard_normal(shape_b)
        gap = nonzero(*np.broadcast_shapes(shape_a, shape_b))(rng)
        return b + gap, b

    return sample
