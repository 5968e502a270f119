"""`pullback train --model gpt` under mpirun: two processes train like one on the same
global batches (5 windows, split 2 and 3: their mean losses must be weighted by those
counts to give the batch's mean), resume from rank 0's checkpoint, and only rank 0
prints and writes.

One launch of two processes; the one-process reference trains here, in the test's own
process. mpirun is started as tests/cli/test_train_mpi.py starts it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

import pullback as pb
from pullback.gpt import GPTConfig, train_gpt

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {"context": 8, "width": 16, "heads": 2, "layers": 1, "steps_per_epoch": 5,
            "epochs": 2, "batch_size": 5}
# float32 rounding: the processes sum each batch's gradient in another order (measured:
# at most 6e-8 after 10 AdamW steps).
WEIGHT_TOL = 2e-6
# Except the attention's key bias (in_proj_bias[width:2 * width]): softmax does not
# change when a constant is added to every score of a row, so its true gradient is 0
# and what it gets is rounding noise, which AdamW divides by the noise's own size:
# steps of about lr in any direction, which differ between 1 and 2 processes.
KEY_BIAS_TOL = 3e-3 * 10  # lr x steps: the most AdamW can move it


def _mpirun(folders: list[Path], *train_args: str,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """`pullback train --model gpt` on one process per folder, each process started in
    its folder (Open MPI's MPMD form, one app context per rank, `--wdir` each), so a
    relative --output shows which ranks wrote."""
    mpirun = shutil.which("mpirun", path=f"{Path(sys.executable).parent}{os.pathsep}"
                                         f"{os.environ.get('PATH', '')}")
    assert mpirun, "mpirun not found: install the mpi extra (pip install 'pullback[mpi]')"
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "NUMBA_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("PULLBACK_FAIL_AT", None)
    args = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()]
    train = [sys.executable, "-m", "pullback.cli", "train", "--model=gpt", *args, *train_args]
    command = [mpirun, "--oversubscribe"]
    for index, folder in enumerate(folders):
        command += [*([":"] if index else []), "-n", "1", "--wdir", str(folder), *train]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)


def _quiet(message: str) -> None:
    pass


def _weights(path: Path) -> dict[str, np.ndarray]:
    return {name: t.numpy() for name, t in pb.load(path).items()}


def test_two_processes_train_the_gpt_like_one_and_only_rank_0_writes(
        tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text("def add(a, b):\n    return a + b\n\nclass Point:\n    x = 1\n" * 30)

    # One process, here: epoch 1 (its checkpoint copied for the processes to resume),
    # then the run finished.
    one = tmp_path / "one"
    config = GPTConfig(text=str(text), output=str(one), **SETTINGS)
    train_gpt(config, progress=False, log=_quiet, sample_tokens=8, stop_after=1)
    rank0, rank1 = tmp_path / "rank0", tmp_path / "rank1"
    shutil.copytree(one, rank0 / "run")
    rank1.mkdir()
    reference = train_gpt(config, resume=True, progress=False, log=_quiet, sample_tokens=8)

    # Two processes resume epoch 1's checkpoint, which only rank 0's folder holds: rank 1
    # gets the weights, optimizer state and generator from rank 0.
    done = _mpirun([rank0, rank1], f"--text={text}", "--output=run", "--resume",
                   "--no-progress")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    # Each process's stdout is a terminal under mpirun: colorama (imported by Numba)
    # writes a reset sequence at exit.
    lines = [line for line in re.sub(r"\x1b\[[0-9;]*m", "", done.stdout).splitlines()
             if line]
    assert re.fullmatch(r"validation loss: \d+\.\d{4}", lines[-1]), done.stdout
    assert sum(line.startswith("validation loss:") for line in lines) == 1
    assert sum(line.startswith("resumed from run/") for line in lines) == 1
    # printed to 4 decimals: equal to the one-process figure up to rounding that last one
    assert abs(float(lines[-1].split(": ")[1]) - reference.validation_loss) <= 5e-5 + 1e-5, \
        (lines[-1], reference.validation_loss)
    assert done.stdout.count("epoch 2/2:") == 1 and done.stdout.count("sample:") == 1
    assert "5 steps in" in done.stdout and "on 2 processes" in done.stdout

    run = rank0 / "run"
    got, want = _weights(run / "model.safetensors"), _weights(one / "model.safetensors")
    assert set(got) == set(want) and "tokens.weight" in want
    width = SETTINGS["width"]
    key_bias = slice(width, 2 * width)
    for name in want:
        error = np.abs(got[name] - want[name])
        if name == "blocks.0.self_attn.in_proj_bias":
            assert float(error[key_bias].max()) <= KEY_BIAS_TOL
            error[key_bias] = 0
        err = float(error.max())
        assert err <= WEIGHT_TOL, f"{name} differs by {err} (bound {WEIGHT_TOL})"
    # Rank 0 wrote what one process writes; rank 1, started in its own folder with the
    # same relative --output, wrote nothing.
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in one.iterdir())
    assert list(rank1.iterdir()) == []
