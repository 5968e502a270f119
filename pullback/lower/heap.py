"""Keeping freed memory in the heap while plans train.

A training step allocates the same large arrays every time (8 MB activations and
their gradients for a small CNN). glibc's malloc adapts its thresholds as a process
runs, and can drift from reusing those heap pages to returning them to the system
and faulting fresh ones in at every step: measured, the CNN step of bench/plans.py
went from 25 to 44 ms within one process (PyTorch's from 24 to 29). Fixing the
thresholds, as a framework's caching allocator would, keeps steps on the fast path.

It is process-wide and changes no result, only where freed memory waits; set
PULLBACK_KEEP_HEAP=0 to leave glibc's defaults alone. Elsewhere than glibc it does
nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# Freed memory stays in the heap up to 1 GiB above its top; blocks under 256 MiB come
# from the heap (the reuse above) rather than from a fresh mapping.
TRIM_THRESHOLD, MMAP_THRESHOLD = 1 << 30, 1 << 28
_done: list[bool] = []


def keep_heap() -> bool:
    """Ask glibc, once per process, to keep freed memory for reuse; whether it did."""
    if _done:
        return _done[0]
    kept = False
    if os.environ.get("PULLBACK_KEEP_HEAP", "1") != "0" and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc: its own allocator, left alone
            mallopt = None
        if mallopt is not None:
            kept = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(
                mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    _done.append(kept)
    return kept
