"""Buffers for a training plan's cotangents: the large gradients its backward pass
writes (an input gradient of a matmul, a convolution or a pool, relu's) go into
arrays kept across calls, as the forward's values do (see buffers.py).

Without them every step allocates and frees megabytes of gradients, and glibc hands
such blocks back to the kernel on free: the next step page-faults them in again
(2,250 faults a step on the CNN of bench/plans.py, 30-36 ms against 24.5 without).

A cotangent gets a buffer when one backward step writes it whole: its value has a
single reader among the differentiated equations (several readers sum their parts,
and that sum is a fresh array), it is not a parameter's (those go to `.grad`, which
the caller keeps), and the step's primitive has a writer here. Any other cotangent
may be a view of the cotangent its step received (add passes it through, reshape
views it), so a buffer stays taken until every cotangent that may view it is
consumed; then the next one may take it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import conv as window_ops
from ..backend.cpu import CpuBackend, relu_backward_kernel
from ..backend.gemm import result_order
from ..kernels.activations import relu_backward
from ..kernels.core import SUPPORTED_DTYPES
from .buffers import Buffer
from .fuse import NUMPY_BACKENDS
from .graph import Var

# A cotangent smaller than this stays a fresh array: NumPy's small allocations do not
# page-fault, and a buffer per small gradient would only add bookkeeping.
MIN_BYTES = 1 << 16


def _relu() -> Any:
    launch = None  # a plan step's shapes never change: its kernel call, prepared once

    def write(backend: Any, ct: Any, node: Any, out: Any) -> tuple:
        nonlocal launch
        y = node.output
        if ct.dtype is y.dtype is out.dtype and ct.dtype in SUPPORTED_DTYPES:
            if launch is None:
                launch = relu_backward.launcher((ct, y), out) or False
            if launch:
                return (launch(ct, y, out=out),)
        return (relu_backward_kernel(ct, y, out=out),)

    return write


def _once(writer: Any) -> Any:
    return lambda: writer  # a writer without state of its own, shared by every step


def _max_pool(backend: Any, ct: Any, node: Any, out: Any) -> tuple:
    p = node.params
    return (window_ops.max_pool2d_backward(ct, node.inputs[0], node.output, p["kernel"],
                                           p["stride"], p["padding"], p["dilation"], out=out),)


def _avg_pool(backend: Any, ct: Any, node: Any, out: Any) -> tuple:
    p = node.params
    return (window_ops.avg_pool2d_backward(ct, node.in_shapes[0], p["kernel"], p["stride"],
                                           p["padding"], out=out),)


def _conv(backend: Any, ct: Any, node: Any, out: Any) -> tuple:
    x, w = node.inputs
    p = node.params
    geometry = (p["stride"], p["padding"], p["dilation"], p["groups"])
    return (window_ops.conv2d_input_backward(ct, w, node.in_shapes[0], *geometry, out=out),
            backend.conv2d_weight_backward(ct, x, node.in_shapes[1], *geometry)
            if node.parents[1] is not None else None)


def _matmul(backend: Any, ct: Any, node: Any, out: Any) -> tuple:
    lhs, rhs = node.inputs
    grad_lhs = np.matmul(ct, rhs.T, out=out)
    grad_rhs = None
    if node.parents[1] is not None:
        grad_rhs = backend.matmul_backward(ct, lhs, rhs, needed=(False, True))[1]
    return grad_lhs, grad_rhs


# primitive -> (a maker of the step's writer, which backends it stands in for), for the
# gradient of the primitive's first operand. Each computes what the primitive's vjp
# computes.
WRITERS = {
    "relu": (_relu, (CpuBackend,)),  # ThreadedCpuBackend splits relu's backward itself
    "max_pool2d": (_once(_max_pool), NUMPY_BACKENDS),
    "avg_pool2d": (_once(_avg_pool), NUMPY_BACKENDS),
    "conv2d": (_once(_conv), NUMPY_BACKENDS),
    "matmul": (_once(_matmul), NUMPY_BACKENDS),
}


def _writable(eqn: Any, parent: Var | None, fortran: set[int]) -> Buffer | None:
    """The buffer a step's first-operand cotangent can be written into, or None."""
    name = eqn.primitive.name
    if (name not in WRITERS or parent is None or parent.kind != "value"
            or parent.dtype not in SUPPORTED_DTYPES or parent.nbytes < MIN_BYTES):
        return None
    if name == "matmul":
        a, b = eqn.args
        if not (isinstance(a, Var) and isinstance(b, Var) and len(a.shape) == 2
                and len(b.shape) == 2 and a.dtype == b.dtype == eqn.out.dtype):
            return None
        return Buffer(parent.shape, parent.dtype, result_order(*parent.shape))
    if name == "relu":  # laid out as relu's output, which its backward reads beside it
        return Buffer(parent.shape, parent.dtype,
                      "F" if eqn.out.index in fortran else "C")
    if name == "conv2d" and eqn.args[1].dtype != parent.dtype:
        return None
    return Buffer(parent.shape, parent.dtype)


def assign(backward: list[tuple], folded: dict[int, Var], skipped: set[int],
           fortran: set[int]) -> tuple[list[int], list[Buffer]]:
    """Per backward step, the buffer its first-operand cotangent is written into (-1:
    none), and the buffers. `backward` holds the plan's backward steps (eqn first),
    `folded` the pool steps whose relu was folded in (pool output -> relu input),
    `skipped` those relus' outputs (their steps receive no cotangent: the pool's step
    hands its own straight to the relu's input), and
    `fortran` the forward values laid out by columns."""
    producers: dict[int, int] = {}
    parents_of = []
    for eqn, node, *_ in backward:
        parents = list(node.parents)  # the differentiated operands (None for others)
        if eqn.out.index in folded:
            parents = [folded[eqn.out.index]]
        elif eqn.out.index in skipped:
            parents = []
        parents_of.append(parents)
        for p in parents:
            if p is not None:
                producers[p.index] = producers.get(p.index, 0) + 1
    owner = [-1] * len(backward)
    buffers: list[Buffer] = []
    idle: dict[Buffer, list[int]] = {}
    pending: dict[int, set[int]] = {}  # a cotangent not yet consumed -> buffers it may view
    for i, (eqn, *_) in enumerate(backward):
        incoming = pending.pop(eqn.out.index, set())
        first = parents_of[i][0] if parents_of[i] else None
        kind = _writable(eqn, first, fortran)
        if kind is not None and producers.get(first.index) == 1:
            pool = idle.get(kind)
            owner[i] = pool.pop() if pool else len(buffers)
            if owner[i] == len(buffers):
                buffers.append(kind)
        for position, parent in enumerate(parents_of[i]):
            if parent is None:
                continue
            refs = {owner[i]} if position == 0 and owner[i] >= 0 else set(incoming)
            pending[parent.index] = pending.get(parent.index, set()) | refs
        still = set().union(*pending.values()) if pending else set()
        for b in incoming - still:  # no cotangent can view it any more
            idle.setdefault(buffers[b], []).append(b)
    return owner, buffers
