"""pb.gradcheck: passes on right derivatives, names input, element and values on wrong ones."""

from __future__ import annotations

import re

import numpy as np
import pytest

import pullback as pb
from pullback.check import adjoint_check, measure
from pullback.tensor.backward import fused_kernels

DTYPES = [np.float32, np.float64]
MODES = ["fast", "full"]


def _smooth(a, b):
    return pb.tanh(a * b) + pb.exp(b), pb.sum(pb.softmax(a, axis=0) * a, axis=1)


def _inputs(dtype):
    rng = np.random.default_rng(0)
    return rng.standard_normal((3, 4)).astype(dtype), rng.standard_normal(4).astype(dtype)


# A unique largest |x| at (1, 2): bad_square's error |3x - 2x| is worst there.
X = np.array([[0.1, -0.2, 0.3], [0.4, 0.5, 1.5]])


def _values(message: str) -> tuple[float, float]:
    found = re.search(r"analytical (\S+), numerical (\S+) ", message)
    assert found, message
    return float(found.group(1)), float(found.group(2))


def test_gradcheck_is_public_and_its_error_is_an_assertion_error():
    assert pb.gradcheck is pb.check.gradcheck
    assert issubclass(pb.GradcheckError, AssertionError)
    assert "gradcheck" in pb.__all__ and "GradcheckError" in pb.__all__


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradcheck_passes_on_right_derivatives(dtype, mode):
    assert pb.gradcheck(_smooth, _inputs(dtype), mode=mode) is True


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gradcheck_passes_second_order_on_right_derivatives(dtype, mode):
    assert pb.gradcheck(_smooth, _inputs(dtype), mode=mode, order=2) is True


def test_gradcheck_takes_one_bare_input_and_tensors():
    assert pb.gradcheck(pb.tanh, np.linspace(-1.0, 1.0, 5))
    assert pb.gradcheck(pb.tanh, pb.tensor(np.linspace(-1.0, 1.0, 5), requires_grad=True))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_wrong_derivative_names_input_element_and_both_values(bad_square, dtype, mode):
    other = np.ones(3, dtype)
    with pytest.raises(pb.GradcheckError) as caught:
        pb.gradcheck(lambda a, b: a + bad_square.bind(b), (other, X.astype(dtype)), mode=mode)
    message = str(caught.value)
    assert "input 1 (shape (2, 3)" in message
    assert "element (1, 2)" in message
    analytical, numerical = _values(message)
    assert analytical == pytest.approx(4.5, rel=1e-3)  # 3x at x = 1.5
    assert numerical == pytest.approx(3.0, rel=1e-2)  # 2x


def test_wrong_derivative_names_the_output_of_a_tuple(bad_square):
    with pytest.raises(pb.GradcheckError, match=r"output 1 element \(1, 2\)"):
        pb.gradcheck(lambda a: (pb.exp(a), bad_square.bind(a)), X, mode="full")


def test_wrong_second_derivative_fails_only_at_order_two(bad_second_square):
    assert pb.gradcheck(bad_second_square.bind, X, mode="full")
    for mode in MODES:
        with pytest.raises(pb.GradcheckError, match=r"the derivative of the (vjp|jvp)") as caught:
            pb.gradcheck(bad_second_square.bind, X, mode=mode, order=2)
        assert "input 0 (shape (2, 3)" in str(caught.value)


def test_wrong_gradient_shape_is_caught(wrong_shape_square):
    with pytest.raises(pb.GradcheckError, match=r"gradient for input 0 has shape \(3,\)"):
        pb.gradcheck(wrong_shape_square.bind, X)


def test_wrong_gradient_dtype_is_caught(wrong_dtype_square):
    with pytest.raises(pb.GradcheckError, match=r"dtype float64, but input 0 has .* float32"):
        pb.gradcheck(wrong_dtype_square.bind, X.astype(np.float32))


def test_wrong_tangent_dtype_is_caught(wrong_tangent_square):
    with pytest.raises(pb.GradcheckError, match=r"jvp's tangent for output 0 .* float64"):
        pb.gradcheck(wrong_tangent_square.bind, X.astype(np.float32))


def test_non_float_inputs_pass_through_unchecked():
    index = np.array([1, 0, 1])
    assert pb.gradcheck(lambda x, i, n: pb.tanh(x[i]) * n, (X, index, 3), mode="full")
    with pytest.raises(ValueError, match="no floating input"):
        pb.gradcheck(lambda i: i * 1.0, (index,))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_non_finite_derivative_fails():
    # sqrt's derivative at 0 is infinite, and its differences there are NaN.
    with pytest.raises(pb.GradcheckError, match=r"element \(0,\)"):
        pb.gradcheck(pb.sqrt, np.array([0.0, 1.0]), mode="full")


def test_fused_kernel_disagreeing_with_rules_is_caught():
    class Broken(pb.CpuBackend):
        def tanh_backward(self, upstream, forward_output):
            return upstream * (1 - forward_output * forward_output) * 1.001

    x = np.linspace(-1.0, 1.0, 6)
    with pb.use_backend(Broken()):
        with pytest.raises(pb.GradcheckError, match="reverse mode"):
            pb.gradcheck(pb.tanh, x)
        assert not adjoint_check(pb.tanh, x).passed
        with fused_kernels(False):  # the rules are right
            assert pb.gradcheck(pb.tanh, x)
            assert adjoint_check(pb.tanh, x).passed


def test_measure_reports_the_worst_comparison_when_passing():
    found = measure(pb.exp, X, mode="full")
    assert found.passed and 0 <= found.error <= found.allowed


def test_tolerances_can_be_loosened(bad_square):
    assert pb.gradcheck(bad_square.bind, X, rtol=1.0)


def test_invalid_mode_and_order_are_rejected():
    with pytest.raises(ValueError, match="mode"):
        pb.gradcheck(pb.exp, X, mode="exhaustive")
    with pytest.raises(ValueError, match="order"):
        pb.gradcheck(pb.exp, X, order=0)
