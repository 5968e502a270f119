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
(a busy machine) costs no waiting. Workers and the caller hand parts over through
flags they poll for a while (pullback.kernels.spin) before they sleep. Which thread
runs a part changes nothing: the parts and what each computes depend only on the size
cut and BLAS's thread count, so results are the same bit for bit whoever runs them.
Where BLAS runs on one thread, or its thread count cannot be set (`blas.limitable()`),
everything runs on the calling thread; so does the work inside a part, which is not
split again.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from pullback.backend import blas
from pullback.kernels import spin

T = TypeVar("T")

_within = threading.local()  # .part: this thread runs a part (work inside is not split)

# A worker's flag (one int64 of a shared array, a cache line apart from the next):
_IDLE, _POSTED, _RUNNING, _TAKEN, _DONE = 0, 1, 2, 3, 4
_SLOT = 8
# A worker that has run a part polls for the next one this many times before it sleeps
# (about 25 ns a poll here: 2 ms), and the caller polls for a worker's part to end this
# many times (20 ms) before it naps between looks (`_naps`); both offer their core to
# other threads every few polls (kernels.spin). Woken by the operating system instead,
# a worker started its part a median 45-73 us late and the caller saw it end 34 us
# late, on parts of a few hundred: ResNet-20's training step took 5% longer so
# (bench/RESULTS.md). A 0.2 ms poll kept little of that gain.
IDLE_POLLS = 80_000
WAIT_POLLS = 800_000


class _Worker:
    """A thread that runs the parts posted to it through its flag, one at a time."""

    def __init__(self, flags: np.ndarray, index: int):
        self.flags, self.at = flags, index * _SLOT
        self.task: Callable[[], Any] | None = None
        self.outcome: tuple[Any, BaseException | None] = (None, None)
        self.cond = threading.Condition()
        threading.Thread(target=self._loop, name=f"pullback-split-{index}", daemon=True).start()

    def post(self, task: Callable[[], Any]) -> None:
        self.task = task
        with self.cond:  # under the lock its sleep checks the flag in: no wakeup lost
            self.flags[self.at] = _POSTED
            self.cond.notify()

    def take_back(self) -> bool:
        """Whether the part posted was not started, and is now the caller's to run."""
        return bool(_claim()(self.flags, self.at, _POSTED, _TAKEN))

    def result(self) -> Any:
        """The posted part's result (or its exception raised), once it has ended."""
        if not _wait_for()(self.flags, self.at, _DONE, WAIT_POLLS):
            naps = _naps()  # a long part: the worker says nothing when it ends
            while not _wait_for()(self.flags, self.at, _DONE, 1):
                time.sleep(next(naps))
        self.flags[self.at] = _IDLE
        (result, error), self.outcome, self.task = self.outcome, (None, None), None
        if error is not None:
            raise error
        return result

    def _loop(self) -> None:
        flags, at, wait_for, claim = self.flags, self.at, _wait_for(), _claim()
        publish_then_wait = spin.compiled(spin.publish_then_wait)
        posted = wait_for(flags, at, _POSTED, IDLE_POLLS)
        while True:
            if not posted:
                with self.cond:
                    while flags[at] != _POSTED:
                        self.cond.wait()
            if not claim(flags, at, _POSTED, _RUNNING):
                posted = wait_for(flags, at, _POSTED, IDLE_POLLS)
                continue  # the caller took it back
            task = self.task
            assert task is not None  # posted before the flag
            try:
                self.outcome = (task(), None)
            except BaseException as exc:  # the caller raises it
                self.outcome = (None, exc)
            task = None  # nothing of the part kept alive while idle
            # "Done" is stored once this thread has let the GIL go, so that the caller,
            # polling for it, then takes the GIL at once: stored from Python, the caller
            # slept until this thread let it go (a wake-up: tens of microseconds).
            posted = publish_then_wait(flags, at, _DONE, _POSTED, IDLE_POLLS)


_lock = threading.Lock()  # making the crew
_busy = threading.Lock()  # held by the call whose parts the crew runs
_crew: list[_Worker] | None = None


def _workers() -> list[_Worker]:
    """The crew, made on first use: one worker fewer than the CPUs (the caller runs a
    part)."""
    global _crew
    if _crew is None:
        with _lock:
            if _crew is None:
                count = max(1, (os.cpu_count() or 2) - 1)
                flags = np.zeros(count * _SLOT, np.int64)
                _crew = [_Worker(flags, i) for i in range(count)]
    return _crew


def _forget_crew() -> None:
    """In a child process after os.fork: the parent's workers are not there, so the
    next split makes a crew of its own (and no lock stays held by a parent's thread)."""
    global _crew, _busy
    _crew, _busy = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_crew)


def _wait_for() -> Any:
    return spin.compiled(spin.wait_for)


def _claim() -> Any:
    return spin.compiled(spin.claim)


def _naps() -> Iterator[float]:
    """Seconds to sleep between looks at a long part's flag: from 50 us, doubling to 1 ms
    (at most 5% of a part that has run the 20 ms of polls)."""
    nap = 50e-6
    while True:
        yield nap
        nap = min(2 * nap, 1e-3)


def parts(n: int) -> list[tuple[int, int]]:
    """The contiguous parts (start, stop) of range(n) that `over_parts` runs: one per
    BLAS thread, at most n; one on a thread already running a part."""
    inside = getattr(_within, "part", False)
    k = min(n, blas.threads()) if n > 1 and blas.limitable() and not inside else 1
    cuts = [n * i // k for i in range(k + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(k)]


def over_parts(n: int, run: Callable[[int, int], T]) -> list[T]:
    """[run(start, stop) for each of `parts(n)`], the parts run at once on BLAS's threads
    (BLAS itself on one thread meanwhile), results in order. Parts beyond the crew, or
    all of them while another thread's call holds the crew, run here in turn."""
    cuts = parts(n)
    if len(cuts) == 1:
        return [run(0, n)]
    blas.note_split()

    def part(a: int, b: int) -> T:
        before, _within.part = getattr(_within, "part", False), True
        try:
            return run(a, b)
        finally:
            _within.part = before

    with blas.one_thread():
        if not _busy.acquire(blocking=False):
            return [part(*cut) for cut in cuts]
        posted: list[_Worker | None] = []
        try:
            for crew_member, cut in zip(_workers(), cuts[1:]):
                crew_member.post(functools.partial(part, *cut))
                posted.append(crew_member)
            results = [part(*cuts[0])]
            for index, cut in enumerate(cuts[1:]):
                worker = posted[index] if index < len(posted) else None
                if worker is not None:
                    # A part no worker has started is taken back and run here.
                    results.append(part(*cut) if worker.take_back() else worker.result())
                    posted[index] = None  # collected
                else:  # beyond the crew
                    results.append(part(*cut))
            return results
        finally:
            for left in posted:  # never return while a part still writes
                if left is not None and not left.take_back():
                    with contextlib.suppress(BaseException):  # the first error is raised
                        left.result()
            _busy.release()


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
