"""Deliberately wrong primitives, declared outside the registry, for checking the checker."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pullback.ad import defjvp, defvjp
from pullback.ops import astype, declare


def _square(name: str) -> Any:
    return declare(name, lambda backend, x: x * x, lambda x: (x.shape, x.dtype),
                   saves_inputs=True, register=False)


@pytest.fixture
def bad_square() -> Any:
    """x * x whose derivative claims 3x instead of 2x."""
    prim = _square("bad_square")
    defjvp(prim, lambda t, out, x: t * x * 3.0)
    return prim


@pytest.fixture
def bad_second_square() -> Any:
    """x * x with a right first derivative, 2x, computed by a `double` whose own
    derivative claims 3: only the second derivative is wrong."""
    double = declare("bad_double", lambda backend, x: x * 2.0, lambda x: (x.shape, x.dtype),
                     register=False)
    defjvp(double, lambda t, out, x: t * 3.0)
    prim = _square("bad_second_square")
    defjvp(prim, lambda t, out, x: t * double.bind(x))
    return prim


@pytest.fixture
def wrong_shape_square() -> Any:
    """x * x whose fused backward sums its gradient over the first axis."""
    prim = _square("wrong_shape_square")
    defjvp(prim, lambda t, out, x: t * x * 2.0)
    defvjp(prim, lambda be, g, n: ((2 * n.inputs[0] * g).sum(axis=0),))
    return prim


@pytest.fixture
def wrong_dtype_square() -> Any:
    """x * x whose fused backward returns float64 whatever the input's dtype."""
    prim = _square("wrong_dtype_square")
    defjvp(prim, lambda t, out, x: t * x * 2.0)
    defvjp(prim, lambda be, g, n: ((2 * n.inputs[0] * g).astype(np.float64),))
    return prim


@pytest.fixture
def wrong_tangent_square() -> Any:
    """x * x whose JVP returns float64 tangents whatever the input's dtype."""
    prim = _square("wrong_tangent_square")
    defjvp(prim, lambda t, out, x: astype(t * x * 2.0, np.float64))
    return prim
