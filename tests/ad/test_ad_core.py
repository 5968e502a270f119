"""The core's vocabulary: the evaluator hook, `bind`, `jvp_of` with symbolic zeros,
and the core's independence from NumPy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from float_world import DTYPE, SCALAR, evaluate_floats, floor_p, mul_p, scale_by_p, sin_p

import pullback
from pullback.ad import DerivativeError, Zero, jvp_of, set_evaluator


def test_pullback_ad_imports_without_numpy() -> None:
    # Load pullback.ad under an empty parent package, so the tensor layer stays out.
    root = Path(pullback.__file__).parent
    script = (
        "import sys, types\n"
        "pkg = types.ModuleType('pullback')\n"
        f"pkg.__path__ = [{str(root)!r}]\n"
        "sys.modules['pullback'] = pkg\n"
        "import pullback.ad\n"
        "assert 'numpy' not in sys.modules, 'pullback.ad imported numpy'\n"
        "print(len(pullback.ad.__all__))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > 0


def test_bind_on_concrete_operands_calls_the_installed_evaluator() -> None:
    assert sin_p.bind(0.5) == pytest.approx(0.479425538604203)
    calls = []
    previous = set_evaluator(lambda prim, args, params: calls.append((prim, args, params)) or 7.0)
    try:
        assert previous is evaluate_floats
        assert mul_p.bind(2.0, 3.0, flag=True) == 7.0
        assert calls == [(mul_p, (2.0, 3.0), {"flag": True})]
    finally:
        set_evaluator(previous)
    assert sin_p.bind(0.0) == 0.0


def test_jvp_of_skips_zero_tangents_and_returns_none_when_all_are_zero() -> None:
    zero = Zero(SCALAR, DTYPE)
    assert jvp_of(mul_p, (zero, zero), None, (2.0, 3.0), {}) is None
    assert jvp_of(mul_p, (1.0, zero), None, (2.0, 3.0), {}) == 3.0
    assert jvp_of(mul_p, (None, 1.0), None, (2.0, 3.0), {}) == 2.0
    # Both active: contributions summed with the tangent add primitive.
    assert jvp_of(mul_p, (1.0, 1.0), None, (2.0, 3.0), {}) == 5.0


def test_jvp_of_raises_for_a_primitive_without_rules() -> None:
    assert not floor_p.has_derivative
    with pytest.raises(DerivativeError, match="floor_no_rule has no derivative rule"):
        jvp_of(floor_p, (1.0,), None, (1.5,), {})


def test_jvp_of_raises_for_an_argument_declared_without_a_rule() -> None:
    zero = Zero(SCALAR, DTYPE)
    assert jvp_of(scale_by_p, (1.0, zero), None, (1.5, 2.0), {}) == 2.0
    with pytest.raises(DerivativeError, match="scale_by is not differentiable in argument 1"):
        jvp_of(scale_by_p, (zero, 1.0), None, (1.5, 2.0), {})
