"""Every core test runs in the float world: its evaluator and tangent sum are installed
for the test and the tensor layer's are put back afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from float_world import add_p, evaluate_floats

from pullback.ad import core, set_evaluator, set_tangent_add


@pytest.fixture(autouse=True)
def float_world() -> Iterator[None]:
    saved_add = list(core._tangent_add)
    previous = set_evaluator(evaluate_floats)
    set_tangent_add(add_p)
    try:
        yield
    finally:
        set_evaluator(previous)
        core._tangent_add[:] = saved_add
