"""Optimizer update kernels against the pure-NumPy formulas, in place through out=."""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_check import LARGE

from pullback.kernels import updates

TOL = {np.float32: {"rtol": 1e-6, "atol": 1e-7}, np.float64: {"rtol": 1e-14, "atol": 1e-16}}


def _state(rng, dtype, shape=(4, 6)):
    param, grad, a, b = (rng.standard_normal(shape).astype(dtype) for _ in range(4))
    return param, grad, a, np.abs(b)


def _close(got, want, dtype):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sgd_update(rng, dtype):
    param, grad, _, _ = _state(rng, dtype)
    _close([updates.sgd_update(param, grad, 0.1, 0.05)], [0.1 * (grad + 0.05 * param)], dtype)
    _close([updates.sgd_update(param, grad, 0.1, 0.0)], [0.1 * grad], dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("first", "nesterov"), [(True, False), (False, False), (False, True)])
def test_sgd_momentum_update_in_place(rng, dtype, first, nesterov):
    param, grad, buf, _ = _state(rng, dtype)
    g = grad + 0.01 * param
    new_buf = g if first else 0.9 * buf + g
    want = 0.05 * (g + 0.9 * new_buf if nesterov else new_buf)
    out = np.empty_like(param)
    update, returned_buf = updates.sgd_momentum_update(param, grad, buf, 0.05, 0.9, 0.01, first,
                                                       nesterov, out=(out, buf))
    assert update is out and returned_buf is buf
    _close([out, buf], [want, new_buf], dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("beta1", "decay", "decoupled"),
                         [(0.9, 0.0, 0.0), (0.9, 0.1, 0.0), (0.3, 0.0, 0.0), (0.8, 0.0, 0.006)])
def test_adam_update_in_place(rng, dtype, beta1, decay, decoupled):
    param, grad, m, v = _state(rng, dtype)
    beta2, eps, lr, step = 0.999, 1e-8, 0.01, 3
    step_size = lr / (1 - beta1**step)
    correction2_sqrt = math.sqrt(1 - beta2**step)
    g = grad + decay * param
    new_m = m + (g - m) * (1 - beta1)
    new_v = beta2 * v + (1 - beta2) * g * g
    want = step_size * new_m / (np.sqrt(new_v) / correction2_sqrt + eps) + decoupled * param
    out = np.empty_like(param)
    updates.adam_update(param, grad, m, v, decay, 1 - beta1, beta1, 1 - beta1 < 0.5, beta2,
                        1 - beta2, step_size, correction2_sqrt, eps, decoupled, out=(out, m, v))
    _close([out, m, v], [want, new_m, new_v], dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_rmsprop_update_in_place(rng, dtype, momentum):
    _, grad, buf, square_avg = _state(rng, dtype)
    beta, eps, lr = 0.9, 1e-3, 0.01
    new_avg = beta * square_avg + (1 - beta) * grad * grad
    out = np.empty_like(grad)
    if momentum:
        new_buf = momentum * buf + grad / (np.sqrt(new_avg) + eps)
        updates.rmsprop_momentum_update(grad, square_avg, buf, lr, beta, 1 - beta, eps,
                                        momentum, out=(out, square_avg, buf))
        _close([out, square_avg, buf], [lr * new_buf, new_avg, new_buf], dtype)
    else:
        updates.rmsprop_update(grad, square_avg, lr, beta, 1 - beta, eps, out=(out, square_avg))
        _close([out, square_avg], [lr * grad / (np.sqrt(new_avg) + eps), new_avg], dtype)


def test_large_update_runs_parallel_and_matches_serial(rng):
    param, grad, m, v = _state(rng, np.float32, LARGE)
    args = (param, grad, m, v, 0.0, 0.1, 0.9, False, 0.999, 0.001, 0.1, 0.05, 1e-8, 0.0)
    parallel = updates.adam_update(*args)
    np.testing.assert_array_equal(parallel[0], updates.adam_update.serial(*args)[0])
    assert ("float32", "flat", "parallel") in updates.adam_update.signatures
