"""`@kernel`: plain-Python kernel bodies, compiled with Numba per dtype, called on arrays.

An elementwise kernel is scalar code (`def silu(x): return x * sigmoid(x)`) applied
with NumPy broadcasting; a row kernel (`rows=True`) gets 1-D rows of the last axis and
writes output rows. Either is compiled lazily, per dtype (float32, float64) and calling
pattern, into a serial loop and a parallel one (`prange`); calls below
`parallel_threshold` elements take the serial loop, so small arrays pay no thread cost.
A float32 kernel computes in float32: its float literals are float32 (see
jit.in_precision), as NumPy's own float32 loops do.

An elementwise forward paired with its backward (`@kernel(backward=k)`) is also an op
on tensors: called with a pullback Tensor among its operands it records, and trains
through its backward kernel (eager, `pb.grad`, training plans, `pb.gradcheck`). The
backward kernel takes `upstream` first, then what it reads, named as the forward's
parameters (its inputs) or `forward_output` (`forward_input` also names the input of
a one-input forward), and returns one gradient per forward input (`outputs=n`);
only what it reads is saved. The ops layer installs that behaviour (`on_tensors`):
this layer imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

import numpy as np

from pullback.kernels.base import PARALLEL_THRESHOLD, SUPPORTED_DTYPES, Kernel
from pullback.kernels.elementwise import ElementwiseKernel
from pullback.kernels.rowwise import ROW_INPUTS, ROW_OUTPUTS, RowKernel

__all__ = ["PARALLEL_THRESHOLD", "ROW_INPUTS", "ROW_OUTPUTS", "SUPPORTED_DTYPES",
           "ElementwiseKernel", "Kernel", "PairedKernel", "RowKernel", "kernel", "on_tensors"]

# (takes(operand) -> bool, call(kernel, args) -> result), installed by the ops layer.
_ON_TENSORS: list[Any] = [None]


def on_tensors(takes: Callable[[Any], bool], call: Callable[[Any, tuple], Any]) -> None:
    """Route a paired kernel's calls that have an operand `takes` accepts (a Tensor)
    to `call(kernel, args)`: how the ops layer makes a kernel pair an op on tensors."""
    _ON_TENSORS[0] = (takes, call)


class PairedKernel(ElementwiseKernel):
    """An elementwise forward kernel with its backward: on arrays, a kernel; on
    tensors, a trainable op (see the module docstring)."""

    def __call__(self, *args: Any, out: Any = None) -> Any:
        hook = _ON_TENSORS[0]
        if hook is not None:
            for a in args:
                if type(a) is not np.ndarray and hook[0](a):
                    if out is not None:
                        raise TypeError(f"{self.name}: out= is for NumPy arrays, not tensors")
                    return hook[1](self, args)
        return ElementwiseKernel.__call__(self, *args, out=out)


@overload
def kernel(fn: Callable[..., Any], *, backward: Kernel | None = None,
           rows: Literal[False] = False, inputs: None = None,
           outputs: int | None = None) -> ElementwiseKernel: ...


@overload
def kernel(fn: Callable[..., Any], *, backward: Kernel | None = None, rows: Literal[True],
           inputs: Sequence[str] | None = None,
           outputs: Sequence[str] | None = None) -> RowKernel: ...


@overload
def kernel(fn: None = None, *, backward: Kernel | None = None, rows: Literal[False] = False,
           inputs: None = None, outputs: int | None = None
           ) -> Callable[[Callable[..., Any]], ElementwiseKernel]: ...


@overload
def kernel(fn: None = None, *, backward: Kernel | None = None, rows: Literal[True],
           inputs: Sequence[str] | None = None, outputs: Sequence[str] | None = None
           ) -> Callable[[Callable[..., Any]], RowKernel]: ...


def kernel(fn: Callable[..., Any] | None = None, *, backward: Kernel | None = None,
           rows: bool = False, inputs: Sequence[str] | None = None,
           outputs: Any = None) -> Kernel | Callable[[Callable[..., Any]], Kernel]:
    """Declare a kernel: `@kernel`, `@kernel(backward=k)`, `@kernel(outputs=2)` for an
    elementwise body returning two values, `@kernel(rows=True)` for a row body
    `f(x_row, out_row)` (kinds as RowKernel says). Returns the callable kernel:
    `k(*arrays, out=None)`, with `k.backward`, `k.name`, `k.python`."""

    def wrap(body: Callable) -> Kernel:
        if rows:
            return RowKernel(body, backward, inputs, outputs)
        if inputs is not None:
            raise TypeError(f"@kernel({body.__name__}): inputs= is for rows=True kernels")
        kind = ElementwiseKernel if backward is None else PairedKernel
        return kind(body, backward, 1 if outputs is None else outputs)

    return wrap if fn is None else wrap(fn)
