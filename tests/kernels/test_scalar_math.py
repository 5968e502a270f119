"""The compiled scalar math (vectorizable exp, tanh, erf, the normal distribution and
density, sigmoid, softplus, libm's sin and cos, and the row reductions) against Python's
math module, across the range and at special values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_check import elementwise

from pullback.kernels import activations, kernel
from pullback.kernels import scalar_math as sm


@kernel
def k_exp(x):
    return sm.exp(x)


@kernel
def k_tanh(x):
    return sm.tanh(x)


@kernel
def k_erf(x):
    return sm.erf(x)


@kernel
def k_normal_cdf(x):
    return sm.normal_cdf_pdf(x)[0]


@kernel
def k_normal_pdf(x):
    return sm.normal_cdf_pdf(x)[1]


@kernel
def k_sin(x):
    return sm.sin(x)


@kernel
def k_cos(x):
    return sm.cos(x)


# Their own kernels are sm.sigmoid and sm.softplus applied, compiled once for both files.
k_sigmoid = activations.sigmoid
k_softplus = activations.softplus


@kernel(rows=True, outputs=("value",) * 6)
def reductions(a, b, c):
    return (sm.row_max(a), sm.row_sum(a), sm.row_dot(a, b), sm.row_dot3(a, b, c),
            sm.row_sum_exp(a, 0.5), sm.row_len(a))


# Worst error against math.* in units of the dtype's epsilon (relative), where the
# result is a normal number; erf is an absolute fit (CpuBackend's coefficients).
CASES = [(k_exp, -700.0, 700.0, 2, 2), (k_tanh, -20.0, 20.0, 3, 3),
         (k_sigmoid, -60.0, 60.0, 3, 3), (k_softplus, -60.0, 60.0, 3, 3),
         (k_sin, -100.0, 100.0, 1, 1), (k_cos, -100.0, 100.0, 1, 1)]
SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-300, -1e-30, 0.3999, 0.4001, 2.0,
            -2.0, 5.9, 6.1, 20.0, -20.0, 88.5, -87.0, -103.0, 709.5, 710.0, -745.0, -800.0]


def _ulps(got: np.ndarray, want: np.ndarray, dtype: type) -> float:
    info = np.finfo(dtype)
    normal = np.isfinite(want) & (np.abs(want) >= info.tiny)
    return float(np.max(np.abs(got[normal] - want[normal]) / np.abs(want[normal])) / info.eps)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("k", "low", "high", "ulps32", "ulps64"), CASES,
                         ids=[c[0].name for c in CASES])
def test_compiled_function_is_within_a_few_ulps(rng, k, low, high, ulps32, ulps64, dtype):
    x = rng.uniform(low, high, 4000).astype(dtype)
    x = np.concatenate([x, rng.uniform(-1, 1, 1000).astype(dtype)])
    with np.errstate(over="ignore"):  # e**x beyond float32's range is inf in both
        want = elementwise(k.python, x).astype(dtype)
    limit = ulps32 if dtype == np.float32 else ulps64
    assert _ulps(k(x).astype(np.float64), want.astype(np.float64), dtype) <= limit


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_erf_matches_math_erf(rng, dtype):
    x = rng.uniform(-7, 7, 5000).astype(dtype)
    atol = 4e-15 if dtype == np.float64 else 7e-7  # the float32 fit errs by 6e-7
    np.testing.assert_allclose(k_erf(x), elementwise(math.erf, x), rtol=0, atol=atol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_normal_cdf_and_pdf_match_math(rng, dtype):
    # One exponential serves both compiled: the distribution is erf's (absolute fit),
    # the density within a few ulps of e**(-x*x/2) / sqrt(2 pi) (x / sqrt 2 rounded
    # first: its square's rounding is the one ulp more).
    x = np.concatenate([rng.uniform(-40, 40, 4000), rng.uniform(-3, 3, 2000),
                        SPECIALS]).astype(dtype)
    exact = [(0.5 * (1 + math.erf(v / math.sqrt(2))),
              math.exp(-0.5 * v * v) / math.sqrt(2 * math.pi)) if math.isfinite(v)
             else sm.normal_cdf_pdf(v) for v in x.astype(np.float64)]
    cdf, pdf = (np.array(values) for values in zip(*exact))
    atol = 4e-15 if dtype == np.float64 else 7e-7
    np.testing.assert_allclose(k_normal_cdf(x), cdf, rtol=0, atol=atol)
    np.testing.assert_array_equal(np.isnan(k_normal_pdf(x)), np.isnan(pdf))
    got = k_normal_pdf(x)
    finite = np.isfinite(x)
    relative = 8 * np.finfo(dtype).eps * (1 + x[finite].astype(np.float64) ** 2)
    close = np.abs(got[finite] - pdf[finite]) <= relative * pdf[finite] + np.finfo(dtype).tiny
    assert close.all(), list(zip(x[finite][~close], got[finite][~close], pdf[finite][~close]))
    np.testing.assert_array_equal(got[~finite], pdf[~finite])  # NaN, and 0 at +-inf


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [k_exp, k_tanh, k_erf, k_sigmoid, k_softplus, k_sin, k_cos],
                         ids=lambda k: k.name)
def test_special_values_match_math(k, dtype):
    x = np.array(SPECIALS, dtype=dtype)
    with np.errstate(over="ignore"):
        want = elementwise(k.python, x).astype(dtype)
    got = k(x)
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    close = np.abs(got - want) <= 4 * np.finfo(dtype).eps * np.abs(want)
    tiny = (np.abs(want) < np.finfo(dtype).tiny) & (np.abs(got) < np.finfo(dtype).tiny)
    bad = ~(same | close | tiny)
    assert not bad.any(), list(zip(x[bad], got[bad], want[bad]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_reductions_match_their_python_references(rng, dtype):
    a, b, c = (rng.standard_normal((3, 37)).astype(dtype) for _ in range(3))
    got = reductions(a, b, c)
    # Sums of 37 terms near 1 that may cancel: an absolute tolerance at their scale.
    tol = {"rtol": 1e-6, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-13, "atol": 1e-13}
    for row in range(3):
        want = reductions.python(a[row], b[row], c[row])
        for value, expected in zip(got, want):
            np.testing.assert_allclose(value[row], expected, **tol)


def test_row_max_skips_nans_and_is_minus_inf_when_empty():
    row = np.array([1.0, np.nan, 3.0, 2.0])
    assert reductions(row, row, row)[0] == 3.0 == sm.row_max(row)
    empty = np.zeros((2, 0))
    assert np.all(reductions(empty, empty, empty)[0] == -np.inf)
