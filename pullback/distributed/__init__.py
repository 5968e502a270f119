"""Data-parallel training over MPI, with Horovod's names:
`import pullback.distributed as dist`.

Every process builds the same model, `dist.broadcast_parameters(model)` gives them the
same weights, each trains on its `dist.shard(...)` of every global batch, and
`dist.DistributedOptimizer(opt)` averages the gradients before each step, so all
processes keep identical weights. Run with `mpirun -n N python script.py` (as root,
with OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1); without mpirun
the same script runs as one process. mpi4py is imported by `dist.init()` only:
install it with `pip install 'pullback[mpi]'`.
"""

from .comm import (
    allreduce,
    broadcast_optimizer_state,
    broadcast_parameters,
    init,
    is_initialized,
    local_rank,
    rank,
    size,
)
from .optimizer import DistributedOptimizer
from .shard import epoch_order, shard

__all__ = [
    "DistributedOptimizer",
    "allreduce",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "epoch_order",
    "init",
    "is_initialized",
    "local_rank",
    "rank",
    "shard",
    "size",
]
