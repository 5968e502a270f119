"""`@kernel`: plain-Python kernel bodies, compiled with Numba per dtype, called on arrays.

An elementwise kernel is scalar code (`def silu(x): return x * sigmoid(x)`) applied
with NumPy broadcasting; a row kernel (`rows=True`) gets 1-D rows of the last axis and
writes output rows. Either is compiled lazily, per dtype (float32, float64) and calling
pattern, into a serial loop and a parallel one (`prange`); calls below
`parallel_threshold` elements take the serial loop, so small arrays pay no thread cost.
A float32 kernel computes in float32: its float literals are float32 (see
jit.in_precision), as NumPy's own float32 loops do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pullback.kernels.base import PARALLEL_THRESHOLD, SUPPORTED_DTYPES, Kernel
from pullback.kernels.elementwise import ElementwiseKernel
from pullback.kernels.rowwise import ROW_INPUTS, ROW_OUTPUTS, RowKernel

__all__ = ["PARALLEL_THRESHOLD", "ROW_INPUTS", "ROW_OUTPUTS", "SUPPORTED_DTYPES",
           "ElementwiseKernel", "Kernel", "RowKernel", "kernel"]


def kernel(fn: Callable | None = None, *, backward: Kernel | None = None, rows: bool = False,
           inputs: Sequence[str] | None = None, outputs: Any = None) -> Any:
    """Declare a kernel: `@kernel`, `@kernel(backward=k)`, `@kernel(outputs=2)` for an
    elementwise body returning two values, `@kernel(rows=True)` for a row body
    `f(x_row, out_row)` (kinds as RowKernel says). Returns the callable kernel:
    `k(*arrays, out=None)`, with `k.backward`, `k.name`, `k.python`."""

    def wrap(body: Callable) -> Kernel:
        if rows:
            return RowKernel(body, backward, inputs, outputs)
        if inputs is not None:
            raise TypeError(f"@kernel({body.__name__}): inputs= is for rows=True kernels")
        return ElementwiseKernel(body, backward, 1 if outputs is None else outputs)

    return wrap if fn is None else wrap(fn)
