"""Issue 15's three CNN bars: one SGD-momentum training step, pullback's TRAINING plan
against PyTorch eager, the same weights and batches, every library on 2 threads.

(a) the issue's digits CNN: 1x8x8, Conv2d(1,16,3) ReLU Conv2d(16,32,3) ReLU Flatten
    Dense(32*4*4,10), batch 128 (bar: plan at most 0.8x PyTorch);
(b) `pullback train`'s CNN (`build_model("cnn")`), batch 32 (bar: at most 0.9x);
(c) bench/plans.py's CNN on 3x32x32, batch 64 (bar: at most 0.75x, and at most 1.0x
    in the machine's slow spells).

Each contender is timed two ways in one run: "alone" (its runs back to back) and
"turns" (the contenders alternating run by run). Slow spells: before each run a memory
bandwidth probe (a 32 MiB np.copyto, best of 3) is timed, and a run is "slow" when its
probe took at least 1.4x the fastest probe of the whole program run (im2col's memory
traffic is what slows down there, while oneDNN barely does). Ratios (pullback time /
PyTorch time, each the best run of its class) are printed for normal and slow runs
separately, with how many runs were slow, and for all runs together; one JSON line of
ratios ends the output.

Run: `python bench/cnn.py` (`--quick` for fewer runs; `--only=a,b` for some of the
workloads; `--profile=a` for a cProfile of 50 plan steps of one workload;
`--threads=1` for one thread each; `--cpu-time` to time each run by the process's
CPU time instead of the wall clock: on a machine other jobs load, with `--threads=1`,
it still compares the contenders' own work, where the wall clock also counts the
time slices they wait for; `--processes` to time each contender's "alone" runs in a
process of its own, where the other never runs: in one process the plan's runs of (a)
that follow a PyTorch step were often 1.5x slower than those that do not, see
bench/RESULTS.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable

from common import pin_threads, plan_sgd_step, profile, torch_sgd_step

THREADS = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--threads=")), 2))
pin_threads(THREADS)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from cnn_models import cifar_cnn, digits, train_cnn  # noqa: E402

LR, MOMENTUM = 0.01, 0.9
SLOW = 1.4  # a probe this many times the fastest marks a run as slow
PROBE_BYTES = 32 << 20


# key: (label, builder, bar, bar in slow spells, calls per run)
WORKLOADS = {
    "a": ("digits CNN 1x8x8, convs 16 and 32, batch 128", digits, 0.8, None, 100),
    "b": ("pullback train's CNN 1x8x8, batch 32", train_cnn, 0.9, None, 100),
    "c": ("CNN 3x32x32, convs 32 and 64 + pools, batch 64", cifar_cnn, 0.75, 1.0, 4),
}


def one_step(build: Callable[[], tuple], name: str) -> Callable[[], object]:
    """One contender's step on the batch and initial weights `steps` gives both (the
    same seeds), without building or running the other's."""
    model, tmodel, shape = build()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, shape[0])
    if name == "pullback":
        return plan_sgd_step(model, x, y, LR, MOMENTUM)
    return torch_sgd_step(tmodel, model, x, y, LR, MOMENTUM)


def alone_in_own_process(key: str, name: str, repeats: int, number: int) -> list:
    """(probe, time) of each of `name`'s runs of workload `key`, timed in a process of
    its own where the other contender never runs (this file with --child)."""
    argv = [sys.executable, __file__, f"--child={key},{name},{repeats},{number}",
            f"--threads={THREADS}"] + (["--cpu-time"] if "--cpu-time" in sys.argv else [])
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return [tuple(run) for run in json.loads(done.stdout.strip().splitlines()[-1])]


def child(spec: str) -> int:
    key, name, repeats, number = spec.split(",")
    fn = one_step(WORKLOADS[key][1], name)
    fn()  # warm up
    print(json.dumps([timed_run(fn, int(number)) for _ in range(int(repeats))]))
    return 0


def steps(build: Callable[[], tuple]) -> dict[str, Callable[[], object]]:
    """The two contenders' steps on the same random batch and initial weights, after
    checking that their first three losses agree (float32, 1e-4 relative)."""
    model, tmodel, shape = build()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, shape[0])
    fns = {"pullback": plan_sgd_step(model, x, y, LR, MOMENTUM),
           "pytorch": torch_sgd_step(tmodel, model, x, y, LR, MOMENTUM)}
    losses = {name: [float(np.asarray(fn().detach() if name == "pytorch" else fn()))
                     for _ in range(3)] for name, fn in fns.items()}
    np.testing.assert_allclose(losses["pullback"], losses["pytorch"], rtol=1e-4)
    return fns


_SRC = np.ones(PROBE_BYTES // 4, np.float32)
_DST = np.empty_like(_SRC)


def probe() -> float:
    """Seconds of a 32 MiB copy, best of 3: the machine's memory speed right now."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        np.copyto(_DST, _SRC)
        best = min(best, time.perf_counter() - start)
    return best


CLOCK = time.process_time if "--cpu-time" in sys.argv else time.perf_counter


def timed_run(fn: Callable[[], object], number: int) -> tuple[float, float]:
    """(probe seconds, seconds per call over `number` calls) of one run."""
    p = probe()
    start = CLOCK()
    for _ in range(number):
        fn()
    return p, (CLOCK() - start) / number


def measure(fns: dict[str, Callable[[], object]], repeats: int,
            number: int, key: str) -> dict[str, dict[str, list]]:
    """Per way ("alone", "turns") and contender, the (probe, time) of every run; with
    --processes, each contender's "alone" runs in a process of its own."""
    for fn in fns.values():
        fn()  # warm up
    if "--processes" in sys.argv:
        alone = {name: alone_in_own_process(key, name, repeats, number) for name in fns}
    else:
        alone = {name: [timed_run(fn, number) for _ in range(repeats)]
                 for name, fn in fns.items()}
    turns: dict[str, list] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            turns[name].append(timed_run(fn, number))
    return {"alone": alone, "turns": turns}


def classify(runs: list, fastest: float) -> dict[str, list[float]]:
    """The run times split by the probe before each: "normal" and "slow"."""
    split: dict[str, list[float]] = {"normal": [], "slow": [], "all": []}
    for p, t in runs:
        split["slow" if p >= SLOW * fastest else "normal"].append(t)
        split["all"].append(t)
    return split


def main() -> int:
    torch.set_num_threads(THREADS)
    spec = next((a.split("=")[1] for a in sys.argv if a.startswith("--child=")), None)
    if spec is not None:
        return child(spec)
    quick = "--quick" in sys.argv
    only = next((a.split("=")[1].split(",") for a in sys.argv if a.startswith("--only=")),
                list(WORKLOADS))
    prof = next((a.split("=")[1] for a in sys.argv if a.startswith("--profile=")), None)
    if prof is not None:
        profile(steps(WORKLOADS[prof][1])["pullback"], 50, 30)
        return 0
    repeats = 4 if quick else 9
    results = {}
    for key in only:
        label, build, *_, number = WORKLOADS[key]
        results[key] = measure(steps(build), repeats, number // 2 if quick else number, key)
    fastest = min(p for ways in results.values() for runs in ways.values()
                  for rs in runs.values() for p, _ in rs)
    clock = "CPU time" if CLOCK is time.process_time else "wall time"
    print(f"training step, SGD momentum, float32, {THREADS} thread(s), {clock}: pullback "
          "TRAINING plan / PyTorch eager")
    print(f"  (best run of each; slow runs: a 32 MiB copy >= {SLOW}x the fastest, "
          f"{fastest * 1e3:.2f} ms)")
    ratios: dict[str, dict[str, float | None]] = {}
    for key in only:
        label, _, bar, slow_bar, _ = WORKLOADS[key]
        print(f"({key}) {label}: bar {bar}" + (f", {slow_bar} in slow spells" if slow_bar else ""))
        for way, runs in results[key].items():
            split = {name: classify(rs, fastest) for name, rs in runs.items()}
            for spell in ("normal", "slow", "all"):
                tp, tt = split["pullback"][spell], split["pytorch"][spell]
                count = f"{len(tp)}+{len(tt)} runs"
                if not tp or not tt:
                    print(f"    {way:5s} {spell:6s} ({count}): no ratio")
                    ratios[f"{key} {way} {spell}"] = None
                    continue
                ratio = min(tp) / min(tt)
                ratios[f"{key} {way} {spell}"] = round(ratio, 3)
                print(f"    {way:5s} {spell:6s} ({count}): pullback {min(tp) * 1e3:7.3f} ms, "
                      f"pytorch {min(tt) * 1e3:7.3f} ms, ratio {ratio:.2f}")
    print(json.dumps({"bench": "cnn", "threads": THREADS, "clock": clock,
                      "pullback / pytorch": ratios}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
