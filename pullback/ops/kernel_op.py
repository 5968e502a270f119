"""A kernel pair as an op on tensors: `@kernel(backward=k)` forwards called on tensors.

Each paired elementwise kernel gets a `CustomOp` subclass named after it, made at
its first call on tensors: forward runs the kernel, backward runs its backward
kernel on what that kernel's parameters name (see pullback.kernels.core) and sums
each gradient over the axes its input was broadcast along. The op saves only what
the backward kernel reads (and the inputs whenever several may broadcast).
"""

from __future__ import annotations

import inspect
from typing import Any, cast

import numpy as np

from ..kernels.core import ElementwiseKernel, PairedKernel, on_tensors
from .custom import CustomOp


class KernelOp(CustomOp):
    """The base of the ops made from kernel pairs; `kernel` and `reads` are per pair."""

    kernel: PairedKernel
    # Per backward argument after upstream: an input's index, or "output".
    reads: tuple[int | str, ...]

    def forward(self, *arrays: Any) -> np.ndarray:
        return self.kernel(*arrays)

    def backward(self, upstream: np.ndarray, inputs: tuple[Any, ...],
                 output: np.ndarray | None) -> tuple[np.ndarray | None, ...]:
        args = [inputs[r] if isinstance(r, int) else output for r in self.reads]
        # An elementwise kernel: `_reads` checked it when the op's class was made.
        backward = cast(ElementwiseKernel, self.kernel.backward)
        grads = backward(upstream, *args)
        if len(inputs) == 1:
            grads = (grads,)
        # An input that was not saved (a one-input forward whose backward reads only
        # the output) has the output's shape; a Python scalar gets no gradient.
        return tuple(g if x is None else _unbroadcast(g, x) if isinstance(x, np.ndarray)
                     else None for g, x in zip(grads, inputs))


def _unbroadcast(grad: np.ndarray, like: np.ndarray) -> np.ndarray:
    """`grad` summed back to `like`'s shape (NumPy broadcasting, reversed)."""
    if grad.shape == like.shape:
        return grad
    lead = grad.ndim - like.ndim
    axes = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(like.shape)
                                      if n == 1 and grad.shape[i + lead] != 1)
    return grad.sum(axis=axes, keepdims=False).reshape(like.shape).astype(like.dtype, copy=False)


def op_class(kernel: PairedKernel) -> type[KernelOp]:
    """The CustomOp subclass of a kernel pair, made once and kept on the kernel."""
    cls: type[KernelOp] | None = kernel.__dict__.get("_pullback_op")
    if cls is None:
        reads, saves = _reads(kernel)
        cls = type(kernel.name, (KernelOp,), {"kernel": kernel, "reads": reads,
                                              "saves": saves, "__doc__": kernel.__doc__})
        kernel.__dict__["_pullback_op"] = cls
    return cls


def _reads(kernel: PairedKernel) -> tuple[tuple[int | str, ...], tuple[str, ...]]:
    """What the backward kernel reads, from its parameters' names, and so what to save."""
    backward = kernel.backward
    where = f"@kernel({kernel.name}, backward={getattr(backward, 'name', None)})"
    if not isinstance(backward, ElementwiseKernel):
        raise TypeError(f"{where}: an op on tensors needs an elementwise backward kernel, "
                        f"not a {type(backward).__name__}")
    inputs = list(inspect.signature(kernel.python).parameters)
    names = list(inspect.signature(backward.python).parameters)[1:]
    if backward.nout != len(inputs):
        raise TypeError(f"{where}: the backward returns {backward.nout} value(s), but a "
                        f"forward of {len(inputs)} input(s) needs one gradient per input "
                        f"(@kernel(outputs={len(inputs)}))")
    reads: list[int | str] = []
    for name in names:
        if name in inputs:
            reads.append(inputs.index(name))
        elif name == "forward_output":
            reads.append("output")
        elif name == "forward_input" and len(inputs) == 1:
            reads.append(0)
        else:
            raise TypeError(
                f"{where}: the backward's parameter {name!r} names neither an input of "
                f"{kernel.name} ({', '.join(inputs)}) nor forward_output; after upstream, "
                "a backward kernel's parameters say which saved values it reads")
    # Several inputs may broadcast: their shapes are needed to sum gradients back.
    needs_inputs = any(r != "output" for r in reads) or len(inputs) > 1
    saves = (("inputs",) if needs_inputs else ()) + (("output",) if "output" in reads else ())
    return tuple(reads), saves


def _takes(operand: Any) -> bool:
    return hasattr(operand, "_data")  # a Tensor (eager or traced by a plan)


def _call(kernel: PairedKernel, args: tuple[Any, ...]) -> Any:
    return op_class(kernel)()(*args)


on_tensors(_takes, _call)
