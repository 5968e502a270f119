"""Run under `mpirun -n N` by test_data_parallel.py (N = 2 and 3): every check of the
data-parallel layer that needs several processes, in one launch, since each launch
costs N process starts and N imports of pullback. Prints "ok <rank>" at the end;
any failed check raises, and the uncaught exception aborts the whole job."""

from __future__ import annotations

import hashlib
import sys

import numpy as np

import pullback as pb
import pullback.distributed as dist
from pullback import nn

TRAINING = pb.LoweringMode.TRAINING
BATCH = 6  # a multiple of 2 and 3: each process takes BATCH / N samples
STEPS = 50
# float32 rounding, with room for the different order of summation over processes.
GRAD_TOL = 2e-6
WEIGHT_TOL = 2e-5


class NumpySGD(pb.optim.GradApplyer):
    """SGD with momentum (PyTorch's: the buffer starts at the first gradient), its rule
    in NumPy: a real applyer whose steps load no Numba kernel, so that each process of
    this script starts in a second rather than four. The model and loss below load none
    either."""

    _buffer_names = ("momentum",)

    def __init__(self, params, lr: float, momentum: float = 0.9) -> None:
        super().__init__(params, lr, momentum=momentum)

    @staticmethod
    def _check_group(where: str, group) -> dict:
        return {"lr": float(group["lr"]), "momentum": float(group["momentum"])}

    def _rule(self, index, param, grad, lr, scale, tmp, out, group) -> None:
        buf = self._state_of(index, param, ("momentum",))["momentum"]
        np.multiply(buf, group["momentum"], out=buf)
        np.add(buf, grad, out=buf)
        param -= np.float32(lr * scale) * buf


def expect_error(kind: type, fragments: list[str], fn, *args) -> str:
    try:
        fn(*args)
    except kind as err:
        message = str(err)
        for fragment in fragments:
            assert fragment in message, (fragment, message)
        return message
    raise AssertionError(f"{fn.__name__} did not raise {kind.__name__}")


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(np.ascontiguousarray(t.numpy()).tobytes())
    return h.hexdigest()


def every_rank(value):
    """`value` from every process, in rank order (mpi4py directly: a test's own helper)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.allgather(value)


def same_everywhere(value: str) -> bool:
    return len(set(every_rank(value))) == 1


def model_for(seed: int, hidden: int = 8) -> nn.Module:
    pb.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, hidden), nn.Linear(hidden, 3))


def clone(model: nn.Module) -> nn.Module:
    """A model of its own with `model`'s weights (not copy.deepcopy, whose copies still
    route gradients to the original's parameters)."""
    twin = model_for(seed=0)
    twin.load_state_dict({n: t.numpy().copy() for n, t in model.state_dict().items()})
    return twin


def loss_of(model: nn.Module):
    return lambda x, y: nn.mse_loss(model(x), y)


def grads(model: nn.Module) -> dict[str, np.ndarray]:
    return {n: p.grad.numpy().copy() for n, p in model.named_parameters()}


def check_close(got: dict, want: dict, tol: float, what: str) -> None:
    for name in want:
        scale = max(1.0, float(np.abs(want[name]).max()))
        err = float(np.abs(got[name] - want[name]).max())
        assert err <= tol * scale, f"{what}: {name} differs by {err} (bound {tol * scale})"


def main() -> None:
    dist.init()
    rank, size = dist.rank(), dist.size()
    assert size == int(sys.argv[1]), (size, sys.argv)
    assert 0 <= dist.local_rank() < size

    # allreduce: each process holds rank-dependent values; results worked out by hand.
    x = np.array([rank, -rank, 1.0], np.float32) + 1
    ranks = np.arange(size, dtype=np.float32)
    np.testing.assert_array_equal(dist.allreduce(x, op="sum"),
                                  [ranks.sum() + size, size - ranks.sum(), 2 * size])
    np.testing.assert_allclose(dist.allreduce(x), [ranks.mean() + 1, 1 - ranks.mean(), 2])
    np.testing.assert_array_equal(dist.allreduce(x, op="max"), [size, 1, 2])
    np.testing.assert_array_equal(dist.allreduce(x, op="min"), [1, 2 - size, 2])
    assert dist.allreduce(rank, op="sum") == size * (size - 1) // 2
    assert isinstance(dist.allreduce(pb.tensor(x)), pb.Tensor)
    assert dist.allreduce(np.array(rank)).dtype == np.float64  # the mean of integers

    # shard: disjoint, covering, in order; epoch_order: the same everywhere.
    order = dist.epoch_order(11, seed=3, epoch=2)
    assert same_everywhere(order.tobytes().hex())
    assert not np.array_equal(order, dist.epoch_order(11, seed=3, epoch=3))
    parts = every_rank(dist.shard(order).tolist())
    assert [i for part in parts for i in part] == order.tolist(), parts
    expect_error(ValueError, [f"{size - 1} indices for {size} processes"], dist.shard,
                 np.arange(size - 1))

    # broadcast_parameters: different seeds, then the root's weights everywhere.
    model = model_for(seed=100 + rank)
    assert not same_everywhere(digest(model))
    dist.broadcast_parameters(model, root_rank=0)
    assert same_everywhere(digest(model))
    start = clone(model)
    if rank == 0:
        assert digest(start) == digest(model_for(seed=100))

    # The averaged gradient equals one process's gradient on the whole global batch.
    rng = np.random.default_rng(0)
    data_x = rng.standard_normal((BATCH * 4, 5)).astype(np.float32)
    data_y = rng.standard_normal((BATCH * 4, 3)).astype(np.float32)
    mine = dist.shard(np.arange(BATCH))
    opt = dist.DistributedOptimizer(NumpySGD(model.parameters(), 0.1),
                                    named_parameters=model.named_parameters(), bucket_bytes=64)
    assert len(opt.buckets) > 1  # several buckets: the overlap path starts them one by one
    step = pb.compile(loss_of(model), data_x[mine], data_y[mine], mode=TRAINING)
    step(data_x[mine], data_y[mine])
    # The plan's backward started every bucket's allreduce; step() only waits.
    assert all(b.request is not None for b in opt.buckets)
    opt.synchronize()
    averaged = grads(model)
    reference = clone(start)
    loss_of(reference)(pb.tensor(data_x[:BATCH]), data_y[:BATCH]).backward()
    check_close(averaged, grads(reference), GRAD_TOL, "averaged gradient")
    opt.zero_grad()
    # Two backward passes before a step accumulate, as on one process: the buckets the
    # first pass sent are sent again.
    step(data_x[mine], data_y[mine])
    step(data_x[mine], data_y[mine])
    opt.synchronize()
    check_close(grads(model), {n: 2 * g for n, g in grads(reference).items()}, GRAD_TOL,
                "gradient accumulated over two passes")
    opt.zero_grad()

    # float64 parameters travel in float64 buckets of their own, beside float32 ones.
    pb.manual_seed(7)
    wide = nn.Linear(5, 3, dtype=np.float64)
    mixed = dist.DistributedOptimizer(NumpySGD(model.parameters() + wide.parameters(), 0.1))
    assert sorted(str(b.buffer.dtype) for b in mixed.buckets) == ["float32", "float64"]
    x64 = data_x[:BATCH].astype(np.float64)
    nn.mse_loss(wide(pb.tensor(x64[mine])), data_y[mine].astype(np.float64)).backward()
    mixed.synchronize()
    got = {n: p.grad.numpy() for n, p in wide.named_parameters()}
    assert all(g.dtype == np.float64 for g in got.values())
    # No process had the float32 gradients: they stay None, not zeros.
    assert all(p.grad is None for p in model.parameters())
    for p in wide.parameters():
        p.grad = None
    nn.mse_loss(wide(pb.tensor(x64)), data_y[:BATCH].astype(np.float64)).backward()
    check_close(got, {n: p.grad.numpy() for n, p in wide.named_parameters()}, 1e-14,
                "float64 gradient")
    del mixed

    # 50 steps: overlap on, overlap off (one bucket per step() call), and eager backward
    # (overlapping too) all train the same weights as one process on the whole batches.
    runs = {}
    for label, overlap, bucket_bytes, planned in [("overlap", True, 64, True),
                                                  ("no overlap", False, 2**20, True),
                                                  ("eager", True, 64, False)]:
        net = clone(start)
        dopt = dist.DistributedOptimizer(NumpySGD(net.parameters(), 0.1),
                                         bucket_bytes=bucket_bytes, overlap=overlap)
        train = pb.compile(loss_of(net), data_x[mine], data_y[mine], mode=TRAINING)
        for i in range(STEPS):
            batch = (i * BATCH) % len(data_x) + dist.shard(np.arange(BATCH))
            dopt.zero_grad()
            if planned:
                train(data_x[batch], data_y[batch])
            else:
                loss_of(net)(pb.tensor(data_x[batch]), data_y[batch]).backward()
            # With overlap, either backward started every bucket's allreduce: step() waits.
            assert all((b.request is not None) == overlap for b in dopt.buckets), label
            dopt.step()
        assert same_everywhere(digest(net)), label
        runs[label] = net
    assert digest(runs["overlap"]) == digest(runs["no overlap"])
    if rank == 0:
        single = clone(start)
        sopt = NumpySGD(single.parameters(), 0.1)
        for i in range(STEPS):
            first = (i * BATCH) % len(data_x)
            sopt.zero_grad()
            loss_of(single)(pb.tensor(data_x[first:first + BATCH]),
                            data_y[first:first + BATCH]).backward()
            sopt.step()
        want = {n: p.numpy() for n, p in single.named_parameters()}
        for label, net in runs.items():
            check_close({n: p.numpy() for n, p in net.named_parameters()}, want, WEIGHT_TOL,
                        f"weights after {STEPS} steps ({label})")

    # broadcast_optimizer_state: the root's momentum everywhere.
    sgd = NumpySGD(model.parameters(), 0.1)
    for p in model.parameters():
        p.grad = pb.tensor(np.full(p.shape, rank + 1.0, np.float32))
    sgd.step()
    dist.broadcast_optimizer_state(sgd, root_rank=0)
    momentum = sgd.state_dict()["state.0.momentum"]
    np.testing.assert_array_equal(momentum, np.ones_like(momentum))

    # module.update(applyer, grads) through a DistributedOptimizer averages the grads too.
    plain = clone(model)
    updated = dist.DistributedOptimizer(NumpySGD(plain.parameters(), 0.5))
    mine_grads = {n: np.full(p.shape, rank + 1.0, np.float32)
                  for n, p in plain.named_parameters()}
    before = {n: p.numpy().copy() for n, p in plain.named_parameters()}
    plain.update(updated, mine_grads)
    mean = (size + 1) / 2  # the mean of 1..size
    for n, p in plain.named_parameters():
        np.testing.assert_allclose(p.numpy(), before[n] - 0.5 * mean, rtol=1e-6, atol=1e-6)
        assert p.grad is None
    del updated

    # Wrong use: a gradient on some processes only; parameters of different shapes.
    missing = dist.DistributedOptimizer(NumpySGD(model.parameters(), 0.1),
                                        named_parameters=model.named_parameters())
    for p in model.parameters():
        p.grad = pb.tensor(np.ones(p.shape, np.float32))
    if rank == size - 1:
        model[1].bias.grad = None
    others = list(range(size - 1))
    expect_error(ValueError, ["'1.bias'", f"gradient on ranks {others}",
                              f"none (None) on ranks [{size - 1}]"], missing.step)
    odd = model_for(seed=1, hidden=8 if rank == 0 else 9)
    wrong = dist.DistributedOptimizer(NumpySGD(odd.parameters(), 0.1),
                                      named_parameters=odd.named_parameters())
    plan = pb.compile(loss_of(odd), data_x[mine], data_y[mine], mode=TRAINING)

    def train_once() -> None:
        plan(data_x[mine], data_y[mine])  # raises here: the first bucket to start checks
        wrong.step()

    expect_error(ValueError, ["'0.weight' is (8, 5) float32 on ranks [0] but (9, 5) float32 "
                              f"on ranks {list(range(1, size))}"], train_once)
    differing = dist.DistributedOptimizer(NumpySGD(model.parameters(), 0.1),
                                          bucket_bytes=64 if rank == 0 else 2**20)
    # 64 bytes: one parameter per bucket, last first (sizes 3, 24, 8, 40), plus one
    # presence flag each; 1 MiB: all 75 elements and 4 flags in one.
    expect_error(ValueError, ["bucket_bytes differs", "rank 0 makes buckets of [4, 25, 9, 41] "
                              "elements, rank 1 makes buckets of [79] elements"], differing.step)
    print(f"ok {rank}", flush=True)


if __name__ == "__main__":
    main()
