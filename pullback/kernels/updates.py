"""Optimizer steps in one pass: each kernel reads a parameter's gradient and buffers
once and returns the update (what to subtract from the parameter) and the new buffers,
written in place when `out=` names the buffers themselves:

    update, exp_avg, exp_avg_sq = adam_update(..., out=(scratch, exp_avg, exp_avg_sq))

Arithmetic in the order pullback.optim's NumPy code used (PyTorch's), so results match
it to rounding. Hyperparameters combined in Python (`1 - beta2`, bias corrections) are
passed precomputed, as the NumPy code computed them in float64 before rounding.
"""

from __future__ import annotations

import math

from pullback.kernels.core import kernel


@kernel
def sgd_update(param, grad, lr, decay):
    """lr * (grad + decay * param)."""
    g = grad + decay * param if decay != 0.0 else grad
    return g * lr


@kernel(outputs=2)
def sgd_momentum_update(param, grad, buf, lr, momentum, decay, first, nesterov):
    """buf = momentum * buf + g (g itself at the first step); the update is lr * buf,
    or lr * (g + momentum * buf) with Nesterov; g = grad + decay * param."""
    g = grad + decay * param if decay != 0.0 else grad
    b = g if first else buf * momentum + g
    step = g + b * momentum if nesterov else b
    return step * lr, b


@kernel(outputs=3)
def adam_update(param, grad, exp_avg, exp_avg_sq, decay, weight, one_minus_weight,
                small_weight, beta2, one_minus_beta2, step_size, correction2_sqrt, eps,
                decoupled_decay):
    """Adam (decay coupled into g) or AdamW (`decoupled_decay` = lr * weight_decay):
    exp_avg lerps toward g by `weight` (PyTorch's formula for weights below or above
    one half), exp_avg_sq averages g**2; the update is
    step_size * m / (sqrt(v) / correction2_sqrt + eps)."""
    g = grad + decay * param if decay != 0.0 else grad
    diff = g - exp_avg
    m = exp_avg + diff * weight if small_weight else g - diff * one_minus_weight
    v = exp_avg_sq * beta2 + (g * one_minus_beta2) * g
    update = (m * step_size) / (math.sqrt(v) / correction2_sqrt + eps)
    if decoupled_decay != 0.0:
        update = update + param * decoupled_decay
    return update, m, v


@kernel(outputs=2)
def rmsprop_update(grad, square_avg, lr, beta, one_minus_beta, eps):
    """square_avg = beta * square_avg + (1 - beta) g**2; lr * g / (sqrt(square_avg) + eps)."""
    v = square_avg * beta + (grad * one_minus_beta) * grad
    return (grad * lr) / (math.sqrt(v) + eps), v


@kernel(outputs=3)
def rmsprop_momentum_update(grad, square_avg, buf, lr, beta, one_minus_beta, eps, momentum):
    """As rmsprop_update, with buf = momentum * buf + g / avg and the update lr * buf."""
    v = square_avg * beta + (grad * one_minus_beta) * grad
    b = buf * momentum + grad / (math.sqrt(v) + eps)
    return b * lr, v, b
