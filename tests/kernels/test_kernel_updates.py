"""Optimizer update kernels against the pure-NumPy formulas, in place through out=:
each writes the new parameter over the old one in the same pass (a parameter's lr
scale folded into lr)."""

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
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_sgd_update(rng, dtype, scale):
    param, grad, _, _ = _state(rng, dtype)
    _close([updates.sgd_update(param, grad, 0.1 * scale, 0.05)],
           [param - scale * (0.1 * (grad + 0.05 * param))], dtype)
    _close([updates.sgd_update(param, grad, 0.1 * scale, 0.0)], [param - scale * 0.1 * grad],
           dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("first", "nesterov", "scale"),
                         [(True, False, 1.0), (False, False, 1.0), (False, True, 1.0),
                          (False, False, 0.5)])
def test_sgd_momentum_update_in_place(rng, dtype, first, nesterov, scale):
    param, grad, buf, _ = _state(rng, dtype)
    g = grad + 0.01 * param
    new_buf = g if first else 0.9 * buf + g
    want = param - scale * 0.05 * (g + 0.9 * new_buf if nesterov else new_buf)
    new_param, returned_buf = updates.sgd_momentum_update(
        param, grad, buf, 0.05 * scale, 0.9, 0.01, first, nesterov, out=(param, buf))
    assert new_param is param and returned_buf is buf
    _close([param, buf], [want, new_buf], dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("beta1", "decay", "decoupled", "scale"),
                         [(0.9, 0.0, 0.0, 1.0), (0.9, 0.1, 0.0, 1.0), (0.3, 0.0, 0.0, 1.0),
                          (0.8, 0.0, 0.006, 1.0), (0.8, 0.0, 0.006, 3.0)])
def test_adam_update_in_place(rng, dtype, beta1, decay, decoupled, scale):
    param, grad, m, v = _state(rng, dtype)
    beta2, eps, lr, step = 0.999, 1e-8, 0.01, 3
    step_size = lr / (1 - beta1**step)
    correction2_sqrt = math.sqrt(1 - beta2**step)
    g = grad + decay * param
    new_m = m + (g - m) * (1 - beta1)
    new_v = beta2 * v + (1 - beta2) * g * g
    want = param - scale * (step_size * new_m / (np.sqrt(new_v) / correction2_sqrt + eps)
                            + decoupled * param)
    updates.adam_update(param, grad, m, v, decay, 1 - beta1, beta1, 1 - beta1 < 0.5, beta2,
                        1 - beta2, step_size * scale, correction2_sqrt, eps, decoupled * scale,
                        out=(param, m, v))
    _close([param, m, v], [want, new_m, new_v], dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("momentum", "scale"), [(0.0, 1.0), (0.9, 1.0), (0.9, 0.5)])
def test_rmsprop_update_in_place(rng, dtype, momentum, scale):
    param, grad, buf, square_avg = _state(rng, dtype)
    beta, eps, lr = 0.9, 1e-3, 0.01
    new_avg = beta * square_avg + (1 - beta) * grad * grad
    if momentum:
        new_buf = momentum * buf + grad / (np.sqrt(new_avg) + eps)
        want = param - scale * lr * new_buf
        updates.rmsprop_momentum_update(param, grad, square_avg, buf, lr * scale, beta, 1 - beta,
                                        eps, momentum, out=(param, square_avg, buf))
        _close([param, square_avg, buf], [want, new_avg, new_buf], dtype)
    else:
        want = param - scale * lr * grad / (np.sqrt(new_avg) + eps)
        updates.rmsprop_update(param, grad, square_avg, lr * scale, beta, 1 - beta, eps,
                               out=(param, square_avg))
        _close([param, square_avg], [want, new_avg], dtype)


def test_large_update_runs_parallel_and_matches_serial(rng):
    param, grad, m, v = _state(rng, np.float32, LARGE)
    args = (param, grad, m, v, 0.0, 0.1, 0.9, False, 0.999, 0.001, 0.1, 0.05, 1e-8, 0.0)
    parallel = updates.adam_update(*args)
    np.testing.assert_array_equal(parallel[0], updates.adam_update.serial(*args)[0])
    assert ("float32", "flat", "parallel") in updates.adam_update.signatures
