"""What a job such as `pullback train` needs around the collectives: whether mpirun
started this process as one of several (read from the environment, without importing
mpi4py), a Python object sent from one process to all, and ending the whole job when
one process fails or stops making progress, so that the others do not wait forever
for it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from types import TracebackType
from typing import TypeVar

from .comm import group

T = TypeVar("T")

# The world size each launcher exports to its processes: Open MPI's mpirun, MPICH's and
# Intel MPI's Hydra (PMI), MVAPICH2's mpirun_rsh.
SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")


def launched_by_mpirun() -> bool:
    """Whether this process is one of several that an MPI launcher started."""
    for name in SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 1:
            return True
    return False


def broadcast_object(value: T, root_rank: int = 0) -> T:
    """The root's `value` (any picklable object) on every process; every process calls it."""
    g = group("pullback.distributed.broadcast_object")
    if g.size == 1:
        return value
    result: T = g.comm.bcast(value if g.rank == root_rank else None, root=root_rank)
    return result


def abort_job(error: BaseException) -> None:
    """Print `error`'s traceback under this process's rank, then end every process of the
    job (MPI_Abort; mpirun then names this rank). Does not return when there are several."""
    g = group("pullback.distributed.abort_job")
    sys.stdout.flush()
    sys.stderr.write(f"pullback.distributed: rank {g.rank} of {g.size} failed; aborting the "
                     "job\n")
    traceback.print_exception(type(error), error, error.__traceback__)
    sys.stderr.flush()
    if g.size > 1:
        g.comm.Abort(1)


class Watchdog:
    """Ends the whole job when `beat()` has not been called for `seconds`: a process that
    is stuck (not dead) leaves the others blocked in a collective that no error ends.
    A context manager; `seconds` <= 0 watches nothing."""

    def __init__(self, seconds: float, what: str = "training step"):
        self.seconds, self.what = seconds, what
        self._last = time.monotonic()
        self._done = threading.Event()

    def __enter__(self) -> Watchdog:
        if self.seconds > 0:
            self.beat()
            threading.Thread(target=self._watch, name="pullback-watchdog", daemon=True).start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._done.set()

    def beat(self) -> None:
        """The job made progress."""
        self._last = time.monotonic()

    def _watch(self) -> None:
        while not self._done.wait(min(1.0, self.seconds / 4)):
            idle = time.monotonic() - self._last
            if idle > self.seconds:
                g = group("pullback.distributed.Watchdog")
                sys.stderr.write(
                    f"pullback.distributed: rank {g.rank} of {g.size}: no {self.what} finished "
                    f"for {idle:.0f} s (the limit is {self.seconds:g} s): a process is stuck "
                    "or far slower than the others; aborting the job\n")
                sys.stderr.flush()
                g.comm.Abort(1)
