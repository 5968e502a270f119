"""Batch norm's kernel pair: each row is one channel's values over the batch (and the
spatial axes), so the statistics are row statistics, as in layer norm, with the
channel's weight and bias as one value per row.

The backward recomputes the row's mean and 1/sqrt(var + eps) from the input (two
passes over a row still in cache) rather than reading them saved: the primitive keeps
one output, the normalized activations the next op reads.
"""

from __future__ import annotations

import math

from pullback.kernels.core import kernel
from pullback.kernels.scalar_math import row_dot, row_len, row_sum


@kernel(rows=True, inputs=("row", "row", "value", "scalar"), outputs=("row", "value", "value"))
def batch_norm_backward(upstream, x, weight, eps, grad_x):
    """Gradients of batch_norm wrt x, the channel's weight and its bias."""
    n = row_len(x)
    mean = row_sum(x) / n
    for j in range(x.shape[0]):
        grad_x[j] = x[j] - mean
    rstd = 1.0 / math.sqrt(row_dot(grad_x, grad_x) / n + eps)
    for j in range(x.shape[0]):
        grad_x[j] = grad_x[j] * rstd  # xhat, overwritten below
    grad_weight = row_dot(upstream, grad_x)
    grad_bias = row_sum(upstream)
    mean_g = grad_bias / n
    mean_g_xhat = grad_weight / n
    scale = weight * rstd
    for j in range(x.shape[0]):
        grad_x[j] = scale * (upstream[j] - mean_g - grad_x[j] * mean_g_xhat)
    return grad_weight, grad_bias


@kernel(rows=True, inputs=("row", "value", "value", "scalar"), outputs=("row", "value", "value"),
        backward=batch_norm_backward)
def batch_norm(x, weight, bias, eps, y):
    """(x - mean) / sqrt(var + eps) * weight + bias over one channel's row; returns
    (y, mean, var), var the biased (population) variance."""
    n = row_len(x)
    mean = row_sum(x) / n
    for j in range(x.shape[0]):
        y[j] = x[j] - mean
    var = row_dot(y, y) / n  # two-pass variance: no cancellation
    scale = weight / math.sqrt(var + eps)
    for j in range(x.shape[0]):
        y[j] = y[j] * scale + bias
    return mean, var
