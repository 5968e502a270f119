"""A training job on one process or several: what `pullback train` (the digits and GPT
jobs) does differently when mpirun started it as one of N processes. `Processes` is
rank 0 of 1 in a plain run (every method then does nothing or returns its input, and
mpi4py is never imported); under mpirun it starts MPI and gives each process its part
of each batch, rank 0's settings, weights and generator, an optimizer that averages
gradients, sums of metrics, the end-of-run check that all processes hold the same
parameters, a watchdog and abort-on-error. Also the testing aid `PULLBACK_FAIL_AT`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import nn, optim
from ..tensor import creation
from . import comm
from .launch import Watchdog, abort_job, broadcast_object, launched_by_mpirun
from .optimizer import DistributedOptimizer
from .shard import shard

T = TypeVar("T")

# A testing aid: "RANK:STEP" makes that process raise as it starts that step (counted
# from 1 over the whole run); "RANK:STEP:kill" kills it with SIGKILL, "RANK:STEP:hang"
# makes it sleep forever.
FAIL_AT = "PULLBACK_FAIL_AT"
# With several processes, a job in which no step finishes for this many seconds is
# ended (0: never): a stuck process would otherwise hold the others forever.
STEP_TIMEOUT = "PULLBACK_STEP_TIMEOUT"
STEP_TIMEOUT_DEFAULT = 600.0


class Processes:
    """The processes training together: rank 0 of 1 in a plain run; under mpirun,
    pullback.distributed's group. Wraps what the job does differently with several."""

    def __init__(self, rank: int = 0, size: int = 1):
        self.rank, self.size = rank, size

    @classmethod
    def start(cls) -> Processes:
        """One process, unless mpirun started several: then MPI starts here (and a plain
        run never imports mpi4py)."""
        if not launched_by_mpirun():
            return cls()
        comm.init()
        return cls(comm.rank(), comm.size())

    @property
    def primary(self) -> bool:
        """Rank 0: the process that reads and writes the output folder and prints."""
        return self.rank == 0

    def check_batches(self, samples: int, batch_size: int) -> None:
        """Every batch of an epoch must give each process at least one sample."""
        last = samples % batch_size
        small = batch_size if batch_size < self.size else last if 0 < last < self.size else 0
        if small:
            which = "each batch" if small == batch_size else "the last batch of each epoch"
            raise ValueError(f"train: --batch-size {batch_size} on {self.size} processes: "
                             f"{which} holds {small} sample(s) of the {samples}, fewer than "
                             f"one per process; use a batch size of at least {self.size} that "
                             f"leaves no last batch smaller than {self.size}")

    def part(self, n: int) -> slice | NDArray[Any]:
        """This process's part of a global batch of `n` samples (all of it, alone)."""
        return slice(None) if self.size == 1 else shard(np.arange(n))

    def agree(self, fn: Callable[[], T]) -> T:
        """`fn()` run by rank 0 alone and its result given to every process; a ValueError
        or OSError it raises is raised on every process, so that all of them end alike."""
        if self.size == 1:
            return fn()
        result: T | None = None
        failure: ValueError | OSError | None = None
        if self.primary:
            try:
                result = fn()
            except (ValueError, OSError) as error:
                failure = error
        message, result = broadcast_object((None if failure is None else str(failure),
                                            result))
        if failure is not None:
            raise failure
        if message is not None:
            raise ValueError(message)
        return cast(T, result)  # rank 0's fn() result: no failure, so it ran

    def share(self, model: nn.Module, optimizer: optim.GradApplyer
              ) -> optim.GradApplyer | DistributedOptimizer:
        """Rank 0's weights, optimizer state and generator on every process, and the
        optimizer to step: one that averages gradients over the processes."""
        if self.size == 1:
            return optimizer
        comm.broadcast_parameters(model)
        comm.broadcast_optimizer_state(optimizer)
        creation.set_default_generator(broadcast_object(creation.default_generator()))
        return DistributedOptimizer(optimizer, model.named_parameters())

    def sum(self, values: ArrayLike) -> NDArray[np.float64]:
        """`values` (float64) summed over the processes."""
        array = np.asarray(values, dtype=np.float64)
        return array if self.size == 1 else comm.allreduce(array, op="sum")

    def from_primary(self, value: T) -> T:
        """Rank 0's `value` on every process."""
        if self.size == 1:
            return value
        return broadcast_object(value)

    def check_same_parameters(self, model: nn.Module) -> None:
        """Every process must hold rank 0's parameters, bit for bit: all of them applied
        the same averaged gradients. (BatchNorm's running statistics may differ: each
        process's come from its own part of the batches.)"""
        if self.size == 1:
            return
        digest = hashlib.sha256()
        for p in model.parameters():
            digest.update(np.ascontiguousarray(p.numpy()).tobytes())
        mine = np.zeros(self.size)
        mine[self.rank] = digest.hexdigest() != broadcast_object(digest.hexdigest())
        differ = np.flatnonzero(self.sum(mine)).tolist()
        if differ:
            raise RuntimeError(f"train: the parameters of rank(s) {differ} differ from rank "
                               "0's after training; the processes fell out of step")

    def watchdog(self) -> Watchdog | _NoWatchdog:
        """With several processes, a context whose `beat()` each step must call within
        PULLBACK_STEP_TIMEOUT seconds, or the job ends; alone, one that does nothing."""
        if self.size == 1:
            return _NoWatchdog()
        value = os.environ.get(STEP_TIMEOUT, "")
        try:
            seconds = float(value) if value else STEP_TIMEOUT_DEFAULT
        except ValueError:
            raise ValueError(f"train: {STEP_TIMEOUT} must be a number of seconds (0: no "
                             f"limit), not {value!r}") from None
        return Watchdog(seconds)

    @contextlib.contextmanager
    def abort_on_error(self) -> Iterator[None]:
        """With several processes, an error inside ends the whole job, naming this rank:
        ending this process alone would leave the others waiting for it forever."""
        if self.size == 1:
            yield
            return
        try:
            yield
        except BaseException as error:
            abort_job(error)
            raise


class _NoWatchdog(contextlib.nullcontext[None]):
    def beat(self) -> None:
        """Nothing to watch in a run of one process."""


def quiet(message: str) -> None:
    """The log of every process but rank 0."""


def fail_if_asked(rank: int, step: int) -> None:
    """Fail as PULLBACK_FAIL_AT asks (a testing aid for faults in multi-process runs)."""
    asked = os.environ.get(FAIL_AT)
    if not asked:
        return
    fields = asked.split(":")
    if len(fields) not in (2, 3) or not all(f.isdigit() for f in fields[:2]) \
            or fields[2:] not in ([], ["kill"], ["hang"]):
        raise ValueError(f"train: {FAIL_AT} must be RANK:STEP, RANK:STEP:kill or RANK:STEP:hang, "
                         f"not {asked!r}")
    if (int(fields[0]), int(fields[1])) != (rank, step):
        return
    if fields[2:] == ["kill"]:
        os.kill(os.getpid(), signal.SIGKILL)
    if fields[2:] == ["hang"]:
        while True:
            time.sleep(60)
    raise RuntimeError(f"train: rank {rank} fails at step {step}, as {FAIL_AT}={asked} asks")


