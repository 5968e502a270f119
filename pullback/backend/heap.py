"""Where the NumPy backends' arrays get their memory: glibc's malloc, told to keep the
pages of freed arrays for the next ones rather than hand them back to the kernel.

A training step frees and allocates the same multi-megabyte arrays every step (an
LSTM's gate activations and their gradients, a transformer's activations). glibc maps
each array above its mmap threshold on its own and unmaps it when freed, and trims
the heap's free top above its trim threshold: either way the next step's array is
new pages, each a page fault and a page of zeros written by the kernel. glibc raises
both thresholds by itself once it has freed a mapped block that large (the mmap one up
to 32 MiB), so how fast a step runs depended on what the process had freed before:
the LSTM bench's plan step took 42-44 ms in a process of its own and 35 ms after three
PyTorch steps had run in it (2,030 page faults a step against 0.2; bench/RESULTS.md,
issue 13). `keep_freed_pages` sets the thresholds that glibc's own rule ends at, once,
for the process: arrays up to 32 MiB come from the heap, and up to 64 MiB of freed
memory stays in it. Thresholds the user set (glibc's MALLOC_MMAP_THRESHOLD_ and
MALLOC_TRIM_THRESHOLD_ environment variables) are left as they are, and so is any C
library but glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

# mallopt's parameters (malloc.h) and the values glibc's dynamic rule reaches on 64-bit
# machines (DEFAULT_MMAP_THRESHOLD_MAX; the trim threshold twice the mmap one).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20

_lock = threading.Lock()
_done: bool | None = None  # None: not tried yet; then whether the thresholds were set


def keep_freed_pages() -> bool:
    """Set glibc's mmap and trim thresholds (once per process; a no-op where the user
    set them or the C library is not glibc). Whether pullback set them."""
    global _done
    with _lock:
        if _done is None:
            _done = _set_thresholds()
        return _done


def _set_thresholds() -> bool:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.restype, mallopt.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_int]
    # mallopt returns 1 on success.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
