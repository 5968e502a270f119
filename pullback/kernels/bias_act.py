"""Bias plus activation over the last axis, `act(x + bias)`, and its backward, which
also sums the bias gradient over rows: one pass each way instead of three or four."""

from __future__ import annotations

import math

from pullback.kernels.core import kernel
from pullback.kernels.scalar_math import erf, exp, sigmoid, tanh

SQRT1_2 = math.sqrt(0.5)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@kernel(rows=True, outputs=("row", "sum"))
def bias_relu_backward(upstream, y, grad_x, grad_bias):
    """upstream where y > 0 (times the mask, so a NaN upstream stays NaN)."""
    for j in range(y.shape[0]):
        g = upstream[j] * (1.0 if y[j] > 0.0 else 0.0)
        grad_x[j] = g
        grad_bias[j] += g


@kernel(rows=True, inputs=("row", "shared"), backward=bias_relu_backward)
def bias_relu(x, bias, out):
    """max(x + bias, 0); NaN stays NaN, as np.maximum."""
    for j in range(x.shape[0]):
        v = x[j] + bias[j]
        out[j] = 0.0 if v <= 0.0 else v


@kernel(rows=True, inputs=("row", "row", "shared"), outputs=("row", "sum"))
def bias_gelu_backward(upstream, x, bias, grad_x, grad_bias):
    """upstream * gelu'(x + bias)."""
    for j in range(x.shape[0]):
        v = x[j] + bias[j]
        cdf = 0.5 * (1.0 + erf(v * SQRT1_2))
        g = upstream[j] * (cdf + v * INV_SQRT_2PI * exp(-0.5 * v * v))
        grad_x[j] = g
        grad_bias[j] += g


@kernel(rows=True, inputs=("row", "shared"), backward=bias_gelu_backward)
def bias_gelu(x, bias, out):
    """gelu(x + bias), exact (erf)."""
    for j in range(x.shape[0]):
        v = x[j] + bias[j]
        out[j] = 0.5 * v * (1.0 + erf(v * SQRT1_2))


@kernel(rows=True, outputs=("row", "sum"))
def bias_tanh_backward(upstream, y, grad_x, grad_bias):
    """upstream * (1 - y**2)."""
    for j in range(y.shape[0]):
        g = upstream[j] * (1.0 - y[j] * y[j])
        grad_x[j] = g
        grad_bias[j] += g


@kernel(rows=True, inputs=("row", "shared"), backward=bias_tanh_backward)
def bias_tanh(x, bias, out):
    """tanh(x + bias)."""
    for j in range(x.shape[0]):
        out[j] = tanh(x[j] + bias[j])


@kernel(rows=True, outputs=("row", "sum"))
def bias_sigmoid_backward(upstream, y, grad_x, grad_bias):
    """upstream * y (1 - y)."""
    for j in range(y.shape[0]):
        g = upstream[j] * y[j] * (1.0 - y[j])
        grad_x[j] = g
        grad_bias[j] += g


@kernel(rows=True, inputs=("row", "shared"), backward=bias_sigmoid_backward)
def bias_sigmoid(x, bias, out):
    """sigmoid(x + bias)."""
    for j in range(x.shape[0]):
        out[j] = sigmoid(x[j] + bias[j])


BIAS_ACT = {"relu": bias_relu, "gelu": bias_gelu, "tanh": bias_tanh, "sigmoid": bias_sigmoid}
