"""Kernels: plain-Python bodies declared with `@kernel` (in pairs, forward naming its
backward), compiled with Numba per dtype, and pullback's own fused kernels:
activations, row ops (softmax, cross-entropy, layer norm), batch norm's channel
rows and (N, C, S) planes, and one-pass optimizer updates. Imports nothing of pullback
but `errors`.
"""

from pullback.kernels import activations, channels, rows, scalar_math, updates
from pullback.kernels.core import (
    PARALLEL_THRESHOLD,
    SUPPORTED_DTYPES,
    ElementwiseKernel,
    Kernel,
    RowKernel,
    kernel,
)

__all__ = [
    "PARALLEL_THRESHOLD",
    "SUPPORTED_DTYPES",
    "ElementwiseKernel",
    "Kernel",
    "RowKernel",
    "activations",
    "channels",
    "kernel",
    "rows",
    "scalar_math",
    "updates",
]
