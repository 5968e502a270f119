"""Buffers for a training plan's cotangents: the large gradients its backward pass
writes (an input gradient of a matmul, a convolution or a pool, relu's) go into
arrays kept across calls, as the forward's values do (see buffers.py).

Without them every step allocates and frees megabytes of gradients, and glibc hands
such blocks back to the kernel on free: the next step page-faults them in again
(2,250 faults a step on the CNN of bench/plans.py, 30-36 ms against 24.5 without).

A step's first-operand cotangent gets a buffer when the step writes it whole: it is
not a parameter's (those go to `.grad`, which the caller keeps), and the step's
primitive declares how it writes that cotangent (`writes_cotangent_into`, beside its
declaration; one that does not gets a new array each call). Where several readers
send the value parts of its cotangent, the plan adds the others into such a buffer in
place (plan.py's executor), so that the sum is no fresh array either. Any other
cotangent may be a view of the cotangent its step received (add passes it through,
reshape views it), so a buffer stays taken until every cotangent that may view it is
consumed; then the next one may take it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..kernels.core import SUPPORTED_DTYPES
from .buffers import Buffer
from .graph import Var

if TYPE_CHECKING:
    from ..ad import Primitive

# A cotangent smaller than this stays a fresh array: NumPy's small allocations do not
# page-fault, and a buffer per small gradient would only add bookkeeping.
MIN_BYTES = 1 << 16


def writer(prim: Primitive) -> Callable[..., Any] | None:
    """The primitive's way of writing its first operand's cotangent into a buffer
    (`write(backend, upstream, node, out)`, computing what its vjp computes), run on a
    backend whose `runs_plan_kernels()` is true; None when it declares none."""
    return None if prim.ct_into is None else prim.ct_into.write


def _writable(eqn: Any, parent: Var | None, fortran: set[int]) -> Buffer | None:
    """The buffer a step's first-operand cotangent can be written into (as `eqn`
    writes it), or None."""
    ct_into = eqn.primitive.ct_into
    if (ct_into is None or parent is None or parent.kind != "value"
            or parent.dtype not in SUPPORTED_DTYPES or parent.nbytes < MIN_BYTES):
        return None
    order = ct_into.order(eqn.args, parent, eqn.out.index in fortran, parent.index in fortran)
    return None if order is None else Buffer(parent.shape, parent.dtype, order)


def assign(backward: list[tuple], folded: dict[int, list[Var]], skipped: set[int],
           fortran: set[int], writes_as: dict[int, Any] | None = None
           ) -> tuple[list[int], list[Buffer]]:
    """Per backward step, the buffer its first-operand cotangent is written into (-1:
    none), and the buffers. `backward` holds the plan's backward steps (eqn first),
    `folded` the steps that took in the step before them in the forward, by output (a
    pool's, whose relu was folded in: the relu's input; a relu's, whose bias add was:
    the add's operands), `skipped` the outputs of the steps taken in (they receive no
    cotangent: the step after them hands its own straight to their operands),
    `fortran` the forward values laid out by columns, and `writes_as` the equation whose
    way of writing its first operand's cotangent a step that took it in uses, by the
    step's output (a bias add's: the product's before it)."""
    parents_of = []
    for eqn, node, *_ in backward:
        parents = list(node.parents)  # the differentiated operands (None for others)
        if eqn.out.index in folded:
            parents = list(folded[eqn.out.index])
        elif eqn.out.index in skipped:
            parents = []
        parents_of.append(parents)
    owner = [-1] * len(backward)
    buffers: list[Buffer] = []
    idle: dict[Buffer, list[int]] = {}
    pending: dict[int, set[int]] = {}  # a cotangent not yet consumed -> buffers it may view
    for i, (eqn, *_) in enumerate(backward):
        incoming = pending.pop(eqn.out.index, set())
        first = parents_of[i][0] if parents_of[i] else None
        kind = _writable((writes_as or {}).get(eqn.out.index, eqn), first, fortran)
        if kind is not None and first is not None:
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
