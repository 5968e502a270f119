"""Work split over BLAS's threads: a convolution's batch, a large matrix product's rows
or columns, attention's heads, a costly elementwise kernel's elements (gelu). Cut into
one contiguous part per BLAS thread, each part runs whole (its own passes and its
products) on a thread of its own, and BLAS runs on one thread meanwhile
(pullback.backend.blas), each part's products on its part's thread. Pullback's own
passes (im2col, Winograd's transforms, attention's softmax) then use every core, not
one while BLAS uses the rest; and where every large product of a step runs so, BLAS's
workers never wake, so none spins on a core a part needs.

The calling thread runs the first part, then takes back every part no worker has
started yet and runs it itself, so a worker the operating system does not schedule
(a busy machine) costs no waiting. Which thread runs a part changes nothing: the parts
and what each computes depend only on the size cut and BLAS's thread count, so results
are the same bit for bit whoever runs them. Where BLAS runs on one thread, or its thread
count cannot be set (`blas.limitable()`), everything runs on the calling thread; so does
the work inside a part, which is not split again.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import numpy as np

from pullback.backend import blas

T = TypeVar("T")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_within = threading.local()  # .part: this thread runs a part (work inside is not split)


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _lock:
            if _pool is None:
                # Threads start on demand, up to one fewer than the CPUs (the caller runs
                # a part).
                _pool = ThreadPoolExecutor(max(1, (os.cpu_count() or 2) - 1),
                                           thread_name_prefix="pullback-split")
                atexit.register(_pool.shutdown, wait=False)
    return _pool


def parts(n: int) -> list[tuple[int, int]]:
    """The contiguous parts (start, stop) of range(n) that `over_parts` runs: one per
    BLAS thread, at most n; one on a thread already running a part."""
    inside = getattr(_within, "part", False)
    k = min(n, blas.threads()) if n > 1 and blas.limitable() and not inside else 1
    cuts = [n * i // k for i in range(k + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(k)]


def over_parts(n: int, run: Callable[[int, int], T]) -> list[T]:
    """[run(start, stop) for each of `parts(n)`], the parts run at once on BLAS's threads
    (BLAS itself on one thread meanwhile), results in order."""
    cuts = parts(n)
    if len(cuts) == 1:
        return [run(0, n)]
    blas.note_split()
    pool = _executor()
    results: list[T] = []

    def part(a: int, b: int) -> T:
        before, _within.part = getattr(_within, "part", False), True
        try:
            return run(a, b)
        finally:
            _within.part = before

    with blas.one_thread():
        futures: list[Future[T]] = [pool.submit(part, *cut) for cut in cuts[1:]]
        try:
            results.append(part(*cuts[0]))
            for cut, future in zip(cuts[1:], futures):
                # A part no worker has started is withdrawn and run here.
                results.append(part(*cut) if future.cancel() else future.result())
        finally:
            for future in futures:  # never return while a part still writes
                if not future.cancel():
                    future.exception()
    return results


# An elementwise kernel of transcendental functions (0.8-3.6 ns an element on one core:
# exp, log, tanh, erf, gelu, sigmoid and their kin) splits from this many elements,
# where a part saves more than waking a thread costs: 1.3-1.7x faster at 2**18
# elements, 1.7-1.95x at 2**20 (bench/RESULTS.md). Kernels bound by memory stay whole:
# split by ThreadedCpuBackend, the adds of GPT's step took 5.3 ms a step against 2.8.
COSTLY_ELEMENTS = 1 << 17


def costly_elementwise(kernel: Callable[..., np.ndarray], *operands: np.ndarray) -> np.ndarray:
    """kernel(*operands), an elementwise kernel taking `out=`, run in one contiguous part
    per BLAS thread (`over_parts`) where every operand is a C-contiguous array of one
    shape and dtype with at least COSTLY_ELEMENTS elements; as one call otherwise
    (which also reports what is wrong with the operands; `out=...`: an array even for
    0-d operands, as NumPy's ufuncs give it). Elementwise, the parts give the one call's
    result bit for bit."""
    first = operands[0]
    if first.size < COSTLY_ELEMENTS or not all(
            isinstance(a, np.ndarray) and a.shape == first.shape and a.dtype == first.dtype
            and a.flags.c_contiguous for a in operands):
        return kernel(*operands, out=...)
    out = np.empty(first.shape, first.dtype)
    flat, target = [a.reshape(-1) for a in operands], out.reshape(-1)
    over_parts(first.size, lambda i, j: kernel(*(a[i:j] for a in flat), out=target[i:j]))
    return out
