"""Spreading a kernel's independent parts (the planes of a convolution's im2col and
col2im) over as many threads as NumPy's BLAS uses, the calling thread working too.

These kernels run between BLAS calls in one convolution, so they take BLAS's thread
count, not a count of their own. The threads are a small pool of Python threads, each
calling the kernel (compiled without the GIL) on parts it takes from a shared counter.
Not Numba's `prange`: its OpenMP workers spin while OpenBLAS's run and the reverse, and
a parallel region waits for every worker; under load (other jobs on the 2 cores) a
ResNet-20 convolution's forward took 70 ms that way against 2.6 ms serial. Here a
worker the OS has not yet scheduled takes no part: the caller does the work, withdraws
the worker's task and never waits for it.
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# Below this many elements written a kernel runs whole on the calling thread: waking a
# thread costs more than the copy (ThreadedCpuBackend's threshold, measured there; a
# chunk of ResNet-20's convolutions writes 0.1-0.5 M elements).
PARALLEL_ELEMENTS = 32768
# Parts per thread: a few, so a late worker leaves little for the caller to wait on,
# and not many, as each part costs a kernel call (a few microseconds).
PARTS_PER_THREAD = 2

# The environment variables OpenBLAS reads its thread count from, in its order.
_BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
_threads: list[int] = []
_pool: list[ThreadPoolExecutor] = []
_lock = threading.Lock()


def blas_threads() -> int:
    """How many threads NumPy's BLAS runs on, as it reads them from the environment when
    it starts (`OPENBLAS_NUM_THREADS`, `GOTO_NUM_THREADS`, `OMP_NUM_THREADS`, the first
    set), else the CPU count. Read once."""
    if not _threads:
        count = os.cpu_count() or 1
        for var in _BLAS_THREAD_VARS:
            value = os.environ.get(var, "").strip()
            if value.isdigit() and int(value) > 0:
                count = int(value)
                break
        _threads.append(count)
    return _threads[0]


def _executor(workers: int) -> ThreadPoolExecutor:
    if not _pool:
        with _lock:
            if not _pool:
                pool = ThreadPoolExecutor(max_workers=workers,
                                          thread_name_prefix="pullback-kernels")
                atexit.register(pool.shutdown, wait=False)
                _pool.append(pool)
    return _pool[0]


def planes(kernel: Callable, count: int, size: int, *args: Any) -> None:
    """`kernel(*args, first, stop)` for the planes first to stop - 1 of [0, count),
    in parts over `blas_threads()` threads where the kernel writes at least
    PARALLEL_ELEMENTS elements (`size`), else once on the calling thread. The kernel
    must write each plane alone, so that the split changes no result."""
    threads = min(blas_threads(), count)
    if threads < 2 or size < PARALLEL_ELEMENTS:
        kernel(*args, 0, count)
        return
    parts = min(count, threads * PARTS_PER_THREAD)
    cuts = [count * k // parts for k in range(parts + 1)]
    taken = itertools.count()  # next() on it is atomic under the GIL

    def work() -> None:
        while (k := next(taken)) < parts:
            kernel(*args, cuts[k], cuts[k + 1])

    pool = _executor(threads - 1)
    futures = [pool.submit(work) for _ in range(threads - 1)]
    try:
        work()
    finally:
        for future in futures:
            if not future.cancel():  # started: it may hold a part, so wait for it
                future.result()
