"""Train data-parallel over MPI with Horovod's names (`pullback.distributed`).

Every process builds the same model; `broadcast_parameters` gives them rank 0's
weights; each process takes its `shard` of every global batch; and
`DistributedOptimizer` averages the gradients over processes (bucket by bucket,
while the backward still runs) before each step, so the weights stay identical.
Rank 0 alone prints. At the end every process checks that its weights equal
rank 0's.

Needs mpi4py (`pip install 'pullback[mpi]'`, which also brings `mpirun`).
Run on 2 processes:  mpirun -n 2 python examples/data_parallel.py
(as root, add --allow-run-as-root). Without mpirun it runs as one process.
"""

from __future__ import annotations

import argparse

import numpy as np

import pullback as pb
import pullback.distributed as dist
from pullback import nn, optim

X = np.random.default_rng(0).normal(size=(256, 10)).astype(np.float32)
Y = (X[:, :5].sum(1) > X[:, 5:].sum(1)).astype(np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="the global batch")
    args = parser.parse_args()

    dist.init()
    pb.manual_seed(0)  # runs on 1 and on N processes start from the same weights
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
    dist.broadcast_parameters(model, root_rank=0)       # every process starts alike
    opt = dist.DistributedOptimizer(optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    dist.broadcast_optimizer_state(opt, root_rank=0)

    for epoch in range(args.epochs):
        order = dist.epoch_order(len(X), seed=0, epoch=epoch)  # the same on every process
        total = 0.0
        for start in range(0, len(order), args.batch_size):
            mine = dist.shard(order[start:start + args.batch_size])  # this process's part
            opt.zero_grad()
            loss = nn.cross_entropy(model(pb.tensor(X[mine])), Y[mine])
            loss.backward()
            opt.step()                                   # gradients averaged, then applied
            total += loss.item() * len(mine)
        total = dist.allreduce(total, op="sum")  # a Python float, summed over processes
        if dist.rank() == 0:
            print(f"epoch {epoch}: train loss {total / len(X):.4f}")

    # The processes applied the same updates, so they hold the same weights.
    flat = np.concatenate([p.numpy().ravel() for p in model.parameters()])
    assert np.array_equal(dist.allreduce(flat, op="max"), flat)
    with pb.no_grad():
        accuracy = (model(pb.tensor(X)).numpy().argmax(1) == Y).mean()
    if dist.rank() == 0:
        print(f"{dist.size()} process(es), identical weights; train accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
