"""What CpuBackend knows of the BLAS NumPy calls: how many threads it runs, and how to
put it on one thread while pullback splits work over threads of its own
(pullback.backend.split), so that each part's products do not start BLAS's threads too.

NumPy's wheels bundle OpenBLAS (as scipy-openblas, its symbols prefixed); the library is
found among those the process has loaded (/proc/self/maps, Linux). Its
`openblas_set_num_threads_local` despite its name sets the count for the whole process
(and returns the previous one): `one_thread` therefore counts the blocks inside it, on
any thread, and restores the count when the last one ends. With another BLAS (MKL,
Accelerate), or where the library cannot be found, `limitable()` is false and callers
do not split.

OpenBLAS's workers spin for a while after each product they run (2**28 cycles by
default, about 0.1 s here) before they sleep, each on a core of its own. Work split
over pullback's threads in that time shares a core with a spinning worker and runs at
about half speed. Paths that leave BLAS threading its products (a convolution not split
by batch) say so (`threading_products`), and from then on, in
this process, a product that could go either way (pullback.backend.gemm) leaves them
to BLAS too (`products_threaded`): a fact of the process's history rather than of the
clock, so that which way a product runs, and so how it rounds, does not depend on
timing.

Conversely, once pullback has split work over its threads in this process (`note_split`,
from pullback.backend.split), a product too small to split runs on one BLAS thread
(`quiet_products`), unless BLAS threads products anyway: one threaded product a
step keeps a worker spinning on the core the next split work needs. The 3x32x32 CNN's
10-class layer alone (64 x 4096 x 10) halved the speed of the split convolution after it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

_lock = threading.Lock()
_threaded = False  # a path has had BLAS thread its products (`threading_products`)
_split = False  # pullback has split work over its threads (`note_split`)
_found: Any = None  # (get_num_threads, set_num_threads_local), or False: none usable

_GET = ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_",
        "scipy_openblas_get_num_threads")


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries loaded in this process (NumPy imported one)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if "openblas" in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/") and ".so" in p)


def _functions() -> Any:
    global _found
    if _found is None:
        with _lock:
            if _found is None:
                np.dot(np.ones(2), np.ones(2))  # NumPy's BLAS is loaded by now
                _found = False
                for path in _loaded_openblas():
                    try:
                        lib = ctypes.CDLL(path)
                    except OSError:
                        continue
                    get = next((getattr(lib, n) for n in _GET if hasattr(lib, n)), None)
                    local = getattr(lib, "openblas_set_num_threads_local", None)
                    if get is not None and local is not None:
                        get.restype, get.argtypes = ctypes.c_int, []
                        local.restype, local.argtypes = ctypes.c_int, [ctypes.c_int]
                        _found = (get, local)
                        break
    return _found


def limitable() -> bool:
    """Whether BLAS's thread count can be lowered for a while (`one_thread`)."""
    return bool(_functions())


def threads() -> int:
    """The threads BLAS runs a large product on (1 when unknown): inside `one_thread`,
    the count before it, so that work split by this count splits alike then."""
    found = _functions()
    if not found:
        return 1
    with _lock:
        return max(1, int(_before if _inside else found[0]()))


_inside = 0  # `one_thread` blocks running, on any thread
_before = 0  # BLAS's thread count when the first of them began


@contextmanager
def one_thread() -> Iterator[None]:
    """BLAS on one thread, for the whole process, while the block runs; its count before
    is restored when the last such block (on any thread) ends."""
    global _inside, _before
    found = _functions()
    if not found:
        yield
        return
    with _lock:
        if _inside == 0:
            _before = found[1](1)
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0:
                found[1](_before)


def threading_products() -> None:
    """Note that a path runs products on BLAS's threads (its workers will spin after
    them), for `products_threaded`."""
    global _threaded
    _threaded = True


def products_threaded() -> bool:
    """Whether a path has run products on BLAS's threads in this process
    (`threading_products`)."""
    return _threaded


def note_split() -> None:
    """Note that pullback has run work split over its threads in this process, for
    `quiet_products`."""
    global _split
    _split = True


def splitting() -> bool:
    """Whether pullback has split work over its threads in this process (`note_split`)."""
    return _split


def quiet_products() -> bool:
    """Whether a product pullback does not split runs on one BLAS thread: where pullback
    splits work in this process (`note_split`) and no path has BLAS thread its products
    (`products_threaded`)."""
    return _split and not _threaded
