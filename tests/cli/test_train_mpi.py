"""`pullback train` under mpirun: two processes train like one on the same global batches,
only rank 0 prints and writes, a failing rank ends the job with its rank named and the
last checkpoint intact, and three processes resume what two began.

Three launches in all (each costs N process starts and N imports of pullback); the
one-process reference trains here, in the test's own process."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import pullback as pb
from pullback.distributed.job import Processes, fail_if_asked
from pullback.io import load_training
from pullback.training import (
    CHECKPOINT,
    TrainConfig,
    build_model,
    make_optimizer,
    train,
)

ROOT = Path(__file__).resolve().parents[2]
# 1438 training digits: 5 batches of 287 and a last one of 3, which 2 processes split
# 1 and 2: their mean losses must be weighted by those counts to give the batch's mean.
SETTINGS = {"model": "mlp", "epochs": 2, "batch_size": 287}
STEPS_PER_EPOCH = 6
# float32 rounding: the processes sum each batch's gradient in another order, and Adam
# divides by the root of the second moment, which magnifies small differences.
WEIGHT_TOL = 2e-5


def _mpirun(n: int, *train_args: str, fail_at: str | None = None,
            timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    mpirun = shutil.which("mpirun", path=f"{Path(sys.executable).parent}{os.pathsep}"
                                         f"{os.environ.get('PATH', '')}")
    assert mpirun, "mpirun not found: install the mpi extra (pip install 'pullback[mpi]')"
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "NUMBA_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           # what rank 0 printed before the job was aborted reaches the pipe
           "PYTHONUNBUFFERED": "1"}
    env.pop("PULLBACK_FAIL_AT", None)
    if fail_at is not None:
        env["PULLBACK_FAIL_AT"] = fail_at
    args = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()]
    command = [mpirun, "-n", str(n), "--oversubscribe", sys.executable, "-m", "pullback.cli",
               "train", *args, *train_args]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)
    return done, time.perf_counter() - started


def _quiet(message: str) -> None:
    pass


def _weights(path: Path) -> dict[str, np.ndarray]:
    return {name: t.numpy() for name, t in pb.load(path).items()}


def _close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    assert set(got) == set(want), what
    for name in want:
        err = float(np.abs(got[name] - want[name]).max())
        assert err <= WEIGHT_TOL, f"{what}: {name} differs by {err} (bound {WEIGHT_TOL})"


def _checkpoint_weights(folder: Path) -> tuple[dict[str, np.ndarray], dict]:
    """The model weights and the rest of a run's checkpoint, loaded as --resume loads it
    (so a damaged or incomplete file fails here)."""
    model = build_model(SETTINGS["model"])
    optimizer = make_optimizer("adam", model.parameters(), 1e-3, 1)
    state = load_training(folder / CHECKPOINT, model=model, optimizer=optimizer)
    return {n: t.numpy().copy() for n, t in model.state_dict().items()}, state


def test_processes_train_like_one_fail_cleanly_and_resume_on_another_count(
        tmp_path: Path) -> None:
    # One process, here: the state after epoch 1, then the run finished.
    reference = tmp_path / "one"
    config = TrainConfig(output=str(reference), **SETTINGS)
    train(config, progress=False, log=_quiet, stop_after=1)
    after_one, _ = _checkpoint_weights(reference)
    finished = train(config, resume=True, progress=False, log=_quiet)

    # Two processes; rank 1 raises as it starts the second step of epoch 2.
    run = tmp_path / "mpi"
    failed, seconds = _mpirun(2, f"--output={run}", fail_at=f"1:{STEPS_PER_EPOCH + 2}")
    assert failed.returncode != 0
    output = failed.stdout + failed.stderr
    assert "rank 1 of 2 failed" in output, output
    assert f"rank 1 fails at step {STEPS_PER_EPOCH + 2}" in output, output
    assert seconds < 100
    # Epoch 1's checkpoint, written by rank 0 alone before the failure, is intact and
    # holds what one process trained in that epoch.
    weights, state = _checkpoint_weights(run)
    assert state["step"] == STEPS_PER_EPOCH and len(state["extra"]["history"]) == 1
    _close(weights, after_one, "epoch 1 on 2 processes against 1")
    assert failed.stdout.count("epoch 1/2:") == 1  # rank 0 printed, rank 1 did not

    # Three processes resume it and end where one process ended.
    resumed, _ = _mpirun(3, f"--output={run}", "--resume", "--no-progress")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # Each process's stdout is a terminal under mpirun: colorama (imported by Numba)
    # writes a reset sequence at exit.
    lines = [line for line in re.sub(r"\x1b\[[0-9;]*m", "", resumed.stdout).splitlines()
             if line]
    assert lines[-1] == f"test accuracy: {finished.test_accuracy:.4f}", resumed.stdout
    assert sum(line.startswith("test accuracy") for line in lines) == 1
    assert sum(line.startswith("resumed from") for line in lines) == 1
    assert f"{STEPS_PER_EPOCH} steps in" in resumed.stdout and "on 3 processes" in resumed.stdout
    assert resumed.stderr.count("Traceback") == 0
    _close(_weights(run / "model.safetensors"), _weights(reference / "model.safetensors"),
           "2 epochs on 2 then 3 processes against 1")


def test_a_plain_run_is_one_process_and_never_imports_mpi4py(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # importing it would now fail
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")  # mpirun -n 1 is a plain run too
    monkeypatch.delenv("PMI_SIZE", raising=False)
    monkeypatch.delenv("MV2_COMM_WORLD_SIZE", raising=False)
    procs = Processes.start()
    assert (procs.rank, procs.size, procs.primary) == (0, 1, True)
    assert procs.part(5) == slice(None)


def test_batches_with_fewer_samples_than_processes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"--batch-size 2 on 3 processes: each batch holds 2 "):
        Processes(0, 3).check_batches(1438, 2)
    # 1438 = 3 x 479 + 1: the last batch of each epoch would leave two processes nothing.
    with pytest.raises(ValueError, match=r"the last batch of each epoch holds 1 sample"):
        Processes(2, 3).check_batches(1438, 479)
    Processes(0, 3).check_batches(1438, 478)  # 3 x 478 + 4: every process has one
    Processes().check_batches(1438, 479)  # one process takes any batch


def test_the_failure_hook_is_checked_and_fires_on_its_rank_and_step(monkeypatch) -> None:
    monkeypatch.setenv("PULLBACK_FAIL_AT", "1:3")
    fail_if_asked(0, 3)
    fail_if_asked(1, 2)
    with pytest.raises(RuntimeError, match="rank 1 fails at step 3"):
        fail_if_asked(1, 3)
    monkeypatch.setenv("PULLBACK_FAIL_AT", "1-3")
    with pytest.raises(ValueError, match="must be RANK:STEP, RANK:STEP:kill or RANK:STEP:hang"):
        fail_if_asked(0, 1)
