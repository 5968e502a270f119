"""Elementwise activation kernels and their backward pairs.

Each forward is one pass where NumPy needs several (gelu: about twenty ufunc calls),
and each backward takes `(upstream, forward_input)` or `(upstream, forward_output)` as
the matching `BackwardOps` method does. Formulas as in pullback.backend.backward_ops.
"""

from __future__ import annotations

import math

from pullback.kernels.core import kernel
from pullback.kernels.scalar_math import SQRT1_2, erf, normal_cdf_pdf, tanh
from pullback.kernels.scalar_math import sigmoid as _sigmoid
from pullback.kernels.scalar_math import softplus as _softplus

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_CUBIC = 0.044715


@kernel
def gelu_backward(upstream, x):
    """upstream * (Phi(x) + x phi(x))."""
    cdf, pdf = normal_cdf_pdf(x)
    return upstream * (cdf + x * pdf)


@kernel(backward=gelu_backward)
def gelu(x):
    """x Phi(x), exact (erf)."""
    return 0.5 * x * (1.0 + erf(x * SQRT1_2))


@kernel
def gelu_tanh_backward(upstream, x):
    """upstream * d/dx of the tanh approximation."""
    t = tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_CUBIC * x * x))
    dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)
    return upstream * 0.5 * (1.0 + t + x * (1.0 - t * t) * dinner)


@kernel(backward=gelu_tanh_backward)
def gelu_tanh(x):
    """PyTorch's tanh approximation of gelu."""
    return 0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_CUBIC * x * x)))


@kernel
def silu_backward(upstream, x):
    """upstream * s (1 + x (1 - s)), s = sigmoid(x)."""
    s = _sigmoid(x)
    return upstream * s * (1.0 + x * (1.0 - s))


@kernel(backward=silu_backward)
def silu(x):
    """x sigmoid(x)."""
    return x * _sigmoid(x)


@kernel
def softplus_backward(upstream, x):
    """upstream * sigmoid(x)."""
    return upstream * _sigmoid(x)


@kernel(backward=softplus_backward)
def softplus(x):
    """log(1 + e**x) without overflow, exact in both tails."""
    return _softplus(x)


@kernel
def relu_backward(upstream, y):
    """upstream where relu's output (or input: the same sign) is positive; a multiply by
    the mask, so a NaN upstream stays NaN, as NumPy's upstream * (y > 0)."""
    return upstream * (1.0 if y > 0.0 else 0.0)


@kernel
def sigmoid_backward(upstream, y):
    """upstream * y (1 - y), from the saved output."""
    return upstream * y * (1.0 - y)


@kernel(backward=sigmoid_backward)
def sigmoid(x):
    """1 / (1 + e**-x) without overflow."""
    return _sigmoid(x)


@kernel
def tanh_backward(upstream, y):
    """upstream * (1 - y**2), from the saved output."""
    return upstream * (1.0 - y * y)
