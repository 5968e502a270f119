"""The specs the primitives declare: one per primitive, and each applies its own primitive."""

from __future__ import annotations

import numpy as np
import pytest

from pullback.check.runner import declared_specs
from pullback.ops import PRIMITIVES

SPECS = declared_specs(PRIMITIVES)


def test_every_primitive_has_a_spec_and_every_spec_a_primitive():
    assert set(PRIMITIVES) == set(SPECS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_each_spec_applies_its_primitive(name):
    prim = PRIMITIVES[name]
    original = prim.impl
    calls = []

    def counting(*args, **params):
        calls.append(params)
        return original(*args, **params)

    prim.impl = counting
    try:
        arrays = SPECS[name].sample(np.random.default_rng(0))
        SPECS[name].fn(*arrays)
    finally:
        prim.impl = original
    assert calls, f"the spec for {name} never binds {name}"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_samples_are_reproducible_float64_or_fixed_non_floats(name):
    first = SPECS[name].sample(np.random.default_rng(7))
    second = SPECS[name].sample(np.random.default_rng(7))
    for a, b in zip(first, second, strict=True):
        assert a.dtype == np.float64 or a.dtype.kind != "f"
        np.testing.assert_array_equal(a, b)


def test_spec_orders_are_one_or_two():
    assert {spec.order for spec in SPECS.values()} <= {1, 2}


def test_specs_without_a_gradient_have_a_numpy_reference():
    for name, spec in SPECS.items():
        assert PRIMITIVES[name].differentiable or spec.reference is not None, name
