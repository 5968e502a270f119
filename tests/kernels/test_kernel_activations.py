"""Activation kernels: each against its Python body (float32, float64, small and in
parallel), each backward against central differences of its forward, and the pullback
ops that run them through pb.gradcheck."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_check import LARGE, SMALL, elementwise, vjp_check

import pullback as pb
from pullback.kernels import activations as act

FORWARD = [act.gelu, act.gelu_tanh, act.silu, act.softplus, act.sigmoid]
BACKWARD = [act.gelu_backward, act.gelu_tanh_backward, act.silu_backward,
            act.softplus_backward, act.sigmoid_backward, act.tanh_backward, act.relu_backward]
# As tests/backend: 1 + erf and 1 + tanh cancel for negative x, where float32 keeps only
# an absolute accuracy of a few ulp of 1, hence the absolute floor.
TOL = {np.float32: {"rtol": 3e-6, "atol": 2e-6}, np.float64: {"rtol": 1e-12, "atol": 1e-14}}


def _inputs(rng, k, shape, dtype):
    # x (or y) over [-9, 9] or so, and a unit upstream for backward kernels.
    x = rng.standard_normal(shape) * 3
    args = [x] if k.nin == 1 else [rng.standard_normal(shape), x]
    return [a.astype(dtype) for a in args]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", FORWARD + BACKWARD, ids=lambda k: k.name)
def test_kernel_matches_its_python_body(rng, k, dtype):
    args = _inputs(rng, k, SMALL, dtype)
    out = k(*args)
    assert out.dtype == dtype and out.shape == SMALL
    np.testing.assert_allclose(out, elementwise(k.python, *args), **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", FORWARD + BACKWARD, ids=lambda k: k.name)
def test_large_call_runs_parallel_and_matches(rng, k, dtype):
    args = _inputs(rng, k, LARGE, dtype)
    out = k(*args)
    assert (dtype.__name__, "flat", "parallel") in k.signatures
    np.testing.assert_array_equal(out, k.serial(*args))
    picked = (slice(None, None, 7), slice(None, None, 131))  # the body in Python is slow
    reference = elementwise(k.python, *(a[picked] for a in args))
    np.testing.assert_allclose(out[picked], reference, **TOL[dtype])


def test_forward_kernels_name_their_backward():
    for forward, backward in zip(FORWARD, BACKWARD):
        assert forward.backward is backward


@pytest.mark.parametrize("k", [act.gelu, act.gelu_tanh, act.silu, act.softplus],
                         ids=lambda k: k.name)
def test_backward_of_input_is_the_vjp_of_forward(rng, k):
    x = rng.standard_normal(SMALL) * 3
    vjp_check(k, lambda u: [k.backward(u, x)], [x], [0], rng)


@pytest.mark.parametrize(("forward", "backward"),
                         [(act.sigmoid, act.sigmoid_backward), (np.tanh, act.tanh_backward),
                          (lambda x: np.maximum(x, 0), act.relu_backward)],
                         ids=["sigmoid", "tanh", "relu"])
def test_backward_of_output_is_the_vjp_of_forward(rng, forward, backward):
    x = rng.standard_normal(SMALL) * 3
    vjp_check(forward, lambda u: [backward(u, forward(x))], [x], [0], rng)


def test_relu_backward_keeps_nan_upstream_and_masks_nan_output():
    upstream = np.array([np.nan, 1.0, 2.0, np.nan], np.float32)
    y = np.array([1.0, np.nan, 0.0, -1.0], np.float32)
    want = upstream * (y > 0)
    np.testing.assert_array_equal(act.relu_backward(upstream, y), want)


def test_softplus_is_exact_in_both_tails():
    x = np.array([-800.0, -40.0, 0.0, 40.0, 800.0])
    np.testing.assert_allclose(act.softplus(x), np.logaddexp(0.0, x), rtol=1e-15)
    assert np.all(np.isfinite(act.sigmoid(x)))


@pytest.mark.parametrize("f", [lambda x: pb.gelu(x), lambda x: pb.gelu(x, "tanh"),
                               pb.silu, pb.softplus, pb.sigmoid, pb.tanh],
                         ids=["gelu", "gelu_tanh", "silu", "softplus", "sigmoid", "tanh"])
def test_ops_running_the_kernels_pass_gradcheck(f):
    x = pb.randn(3, 4, dtype=np.float64, seed=3)
    assert pb.gradcheck(f, (x,))
