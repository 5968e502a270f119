"""Row kernels over the last axis: softmax (and its causal form), log_softmax,
cross-entropy, layer norm (its statistics alone, and its backward from its input).

Each reads a row a few times while it is in cache, where NumPy makes a full-size
temporary per step (max, subtract, exp, sum, divide). Backwards take the saved output
(softmax, log_softmax) or recompute from the input (cross-entropy: the logits).
"""

from __future__ import annotations

import math

from pullback.kernels.core import kernel
from pullback.kernels.scalar_math import (
    exp,
    layer_norm_row_grads,
    row_dot,
    row_len,
    row_max,
    row_sum,
    row_sum_exp,
    row_sum_sq_dev,
)

NAN = math.nan  # a module float: the float32 kernel gets a float32 NaN (jit.in_precision)


@kernel(rows=True)
def softmax_backward(upstream, y, out):
    """y * (upstream - sum(upstream * y))."""
    dot = row_dot(upstream, y)
    for j in range(y.shape[0]):
        out[j] = y[j] * (upstream[j] - dot)


@kernel(rows=True, backward=softmax_backward)
def softmax(x, out):
    """e**(x - max) / sum(e**(x - max))."""
    m = row_max(x)
    for j in range(x.shape[0]):
        out[j] = exp(x[j] - m)
    total = row_sum(out)
    for j in range(x.shape[0]):
        out[j] = out[j] / total


@kernel(rows=True, inputs=("row", "index", "scalar"))
def causal_softmax(x, seen, scale, out):
    """softmax of scale * x over the first `seen` elements, zeros past them: attention's
    scores scaled and causally masked in the softmax's own pass (softmax_backward of
    its output gives the masked elements zero gradient, their weights being zero).
    `scale` a value of the row's dtype: scale * x rounds as that dtype's product."""
    for j in range(seen):
        out[j] = scale * x[j]
    m = row_max(out[:seen])
    for j in range(seen):
        out[j] = exp(out[j] - m)
    total = row_sum(out[:seen])
    for j in range(seen):
        out[j] = out[j] / total
    for j in range(seen, x.shape[0]):
        out[j] = 0.0


@kernel(rows=True, inputs=("row", "row", "scalar"))
def scaled_softmax_backward(upstream, y, scale, out):
    """scale * y * (upstream - sum(upstream * y)): softmax's backward, times the scale
    its input was multiplied by (attention's scores)."""
    dot = row_dot(upstream, y)
    for j in range(y.shape[0]):
        out[j] = scale * (y[j] * (upstream[j] - dot))


@kernel(rows=True)
def log_softmax_backward(upstream, y, out):
    """upstream - e**y * sum(upstream), y being the log-softmax output."""
    total = row_sum(upstream)
    for j in range(y.shape[0]):
        out[j] = upstream[j] - exp(y[j]) * total


@kernel(rows=True, backward=log_softmax_backward)
def log_softmax(x, out):
    """(x - max) - log(sum(e**(x - max)))."""
    m = row_max(x)
    log_total = math.log(row_sum_exp(x, m))
    for j in range(x.shape[0]):
        out[j] = (x[j] - m) - log_total


@kernel(rows=True, inputs=("value", "row", "index"))
def cross_entropy_backward(upstream, logits, label, grad):
    """upstream * (softmax(logits) - onehot(label)), recomputed from the logits."""
    m = row_max(logits)
    for j in range(logits.shape[0]):
        grad[j] = exp(logits[j] - m)
    scale = upstream / row_sum(grad)
    for j in range(logits.shape[0]):
        grad[j] = grad[j] * scale
    if 0 <= label < logits.shape[0]:
        grad[label] = grad[label] - upstream


@kernel(rows=True, inputs=("row", "index"), outputs=("value",), backward=cross_entropy_backward)
def cross_entropy(logits, label):
    """-log softmax(logits)[label] for one row; NaN for a label out of range."""
    m = row_max(logits)
    log_total = math.log(row_sum_exp(logits, m))
    if 0 <= label < logits.shape[0]:
        # (m - x) first: exact for the large, close logits where m + log_total would round.
        return (m - logits[label]) + log_total
    return NAN


@kernel(rows=True, inputs=("row", "row", "shared", "value", "value"),
        outputs=("row", "sum", "sum"))
def layer_norm_backward(upstream, x, weight, mean, rstd, grad_x, grad_weight, grad_bias):
    """Gradients of layer_norm wrt x, weight and bias (summed over rows)."""
    layer_norm_row_grads(upstream, x, weight, mean, rstd, grad_x, grad_weight, grad_bias)


@kernel(rows=True, inputs=("row", "row", "shared", "scalar"), outputs=("row", "sum", "sum"))
def layer_norm_backward_of_input(upstream, x, weight, eps, grad_x, grad_weight, grad_bias):
    """layer_norm_backward with each row's mean and rstd computed first, as
    layer_norm_statistics computes them (the same bits), while the row is in cache: one
    pass over x where the statistics alone would take another."""
    n = row_len(x)
    mean = row_sum(x) / n
    rstd = 1.0 / math.sqrt(row_sum_sq_dev(x, mean) / n + eps)
    layer_norm_row_grads(upstream, x, weight, mean, rstd, grad_x, grad_weight, grad_bias)


@kernel(rows=True, inputs=("row", "shared", "shared", "scalar"),
        outputs=("row", "value", "value"), backward=layer_norm_backward)
def layer_norm(x, weight, bias, eps, y):
    """(x - mean) / sqrt(var + eps) * weight + bias; returns (y, mean, rstd)."""
    n = row_len(x)
    mean = row_sum(x) / n
    for j in range(x.shape[0]):
        y[j] = x[j] - mean
    rstd = 1.0 / math.sqrt(row_dot(y, y) / n + eps)  # two-pass variance: no cancellation
    for j in range(x.shape[0]):
        y[j] = y[j] * rstd * weight[j] + bias[j]
    return mean, rstd


@kernel(rows=True, inputs=("row", "scalar"), outputs=("value", "value"))
def layer_norm_statistics(x, eps):
    """(mean, 1 / sqrt(var + eps)) of a row, as layer_norm computes them, without
    writing a row: what layer_norm's backward recomputes rather than keeps."""
    n = row_len(x)
    mean = row_sum(x) / n
    return mean, 1.0 / math.sqrt(row_sum_sq_dev(x, mean) / n + eps)
