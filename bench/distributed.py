"""Data-parallel scaling on this machine: step time and samples per second of the wide MLP
and the CNN on 1 and 2 processes (one thread each, so the two cores stand for two
machines), with the gradients' allreduce overlapping the backward and without; and the
allreduce's bandwidth against a plain NumPy copy of the same bytes.

Weak scaling, as Horovod's benchmarks: each process keeps the one-process batch, so 2
processes train twice the samples per step; scaling efficiency is one process's step
time over the N-process step time. `python bench/distributed.py` launches itself under
mpirun (`--worker`) once per process count and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

THREADS = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                  "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")}
os.environ.update(THREADS)  # before NumPy starts its BLAS pool

import numpy as np  # noqa: E402

REPEATS, NUMBER = 5, 10
# Small enough that the wide MLP's 7.5 MB of gradients make several buckets: with
# DDP's 25 MB it would be one, which can only start when the whole backward is done.
BUCKET_BYTES = 2**20
ALLREDUCE_MB = (1, 4, 16)


def _models() -> dict[str, tuple]:
    import pullback as pb
    from pullback import nn

    pb.manual_seed(0)
    mlp = nn.Sequential(nn.Dense(784, 1024), nn.ReLU(), nn.Dense(1024, 1024), nn.ReLU(),
                        nn.Dense(1024, 10))
    cnn = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Dense(64 * 8 * 8, 10))
    return {"wide MLP 784-1024-1024-10, batch 256": (mlp, (256, 784)),
            "CNN on 3x32x32, batch 64": (cnn, (64, 3, 32, 32))}


def _best_step(step: object, dist: object) -> float:
    """Seconds per step: the slowest process's time, best of REPEATS runs of NUMBER."""
    step()  # warm up: plan buffers, the first allreduce
    best = float("inf")
    for _ in range(REPEATS):
        dist.allreduce(np.zeros(1))  # start together
        start = time.perf_counter()
        for _ in range(NUMBER):
            step()
        mine = (time.perf_counter() - start) / NUMBER
        best = min(best, float(dist.allreduce(np.array([mine]), op="max")[0]))
    return best


def _steps(dist: object) -> list[dict]:
    import pullback as pb
    from pullback import nn, optim

    rows = []
    for name, (model, shape) in _models().items():
        rng = np.random.default_rng(dist.rank())
        x = rng.standard_normal(shape).astype(np.float32)
        y = rng.integers(0, 10, shape[0])
        dist.broadcast_parameters(model)
        plan = pb.compile(lambda x, y, model=model: nn.cross_entropy(model(x), y), x, y,
                          mode=pb.LoweringMode.TRAINING)
        # None: each process steps on its own gradients, no allreduce (what the two
        # processes' compute alone achieves side by side).
        for overlap in ((None, False, True) if dist.size() > 1 else (False,)):
            opt = optim.SGD(model.parameters(), 0.01, momentum=0.9)
            if overlap is not None:
                opt = dist.DistributedOptimizer(opt, bucket_bytes=BUCKET_BYTES, overlap=overlap)

            def step(opt: object = opt, plan: object = plan, x: object = x, y: object = y) -> None:
                opt.zero_grad()
                plan(x, y)
                opt.step()

            seconds = _best_step(step, dist)
            rows.append({"model": name, "processes": dist.size(), "overlap": overlap,
                         "step_s": seconds, "samples_s": dist.size() * shape[0] / seconds})
            del opt  # its gradient-ready hook goes with it
    return rows


def _allreduce(dist: object) -> list[dict]:
    """In place, as DistributedOptimizer sends its buckets (zeros: sums stay finite)."""
    from mpi4py import MPI

    rows = []
    for mb in ALLREDUCE_MB:
        data = np.zeros(mb * 2**20 // 4, dtype=np.float32)
        out = np.empty_like(data)
        copy = _best_step(lambda data=data, out=out: np.copyto(out, data), dist)
        reduce = _best_step(lambda data=data: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, data),
                            dist)
        rows.append({"mb": mb, "copy_s": copy, "allreduce_s": reduce})
    return rows


def worker() -> None:
    import pullback.distributed as dist

    dist.init()
    result = {"steps": _steps(dist), "allreduce": _allreduce(dist) if dist.size() > 1 else []}
    if dist.rank() == 0:
        print(json.dumps(result))


def _launch(processes: int) -> dict:
    mpirun = shutil.which("mpirun", path=f"{Path(sys.executable).parent}{os.pathsep}"
                                         f"{os.environ.get('PATH', '')}")
    if mpirun is None:
        raise SystemExit("bench/distributed.py: mpirun not found; pip install 'pullback[mpi]'")
    # This checkout's pullback, whichever copy pip installed.
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
    env = {**os.environ, **THREADS, "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PYTHONPATH": path}
    done = subprocess.run([mpirun, "-n", str(processes), sys.executable, __file__,
                           "--worker"], capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"mpirun -n {processes} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help="(run by mpirun)")
    if parser.parse_args().worker:
        worker()
        return 0
    one, two = _launch(1), _launch(2)
    print("| model | processes | overlap | step | samples/s | speed-up | efficiency |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for name in dict.fromkeys(row["model"] for row in one["steps"]):
        base = next(row for row in one["steps"] if row["model"] == name)
        for row in [base] + [r for r in two["steps"] if r["model"] == name]:
            speed_up = row["samples_s"] / base["samples_s"]
            overlap = ("-" if row["processes"] == 1 else "no allreduce"
                       if row["overlap"] is None else "on" if row["overlap"] else "off")
            print(f"| {name} | {row['processes']} | {overlap} | {row['step_s'] * 1e3:.1f} ms | "
                  f"{row['samples_s']:.0f} | {speed_up:.2f}x | "
                  f"{speed_up / row['processes']:.0%} |")
    print()
    print("| float32 | NumPy copy | allreduce, 2 processes | allreduce / copy |")
    print("|---:|---:|---:|---:|")
    for row in two["allreduce"]:
        nbytes = row["mb"] * 2**20
        print(f"| {row['mb']} MiB | {row['copy_s'] * 1e3:.2f} ms "
              f"({nbytes / row['copy_s'] / 1e9:.1f} GB/s) | {row['allreduce_s'] * 1e3:.2f} ms "
              f"({nbytes / row['allreduce_s'] / 1e9:.1f} GB/s) | "
              f"{row['allreduce_s'] / row['copy_s']:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
