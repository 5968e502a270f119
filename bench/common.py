"""Shared timing helpers for the benchmarks: best-of-repeats wall time, pinned threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

ALONE = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--alone=")), None)
"""In a process `both_ways` started under --processes: "case|contender", the one step it
times. Benchmarks skip their cross-checks (which run every contender) and the other
cases when it is set (`wanted`)."""


ROUNDS = int(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--rounds=")), 3))
"""Rounds of "alone" processes under --processes, the contenders taking turns."""


def pin_threads(n: int = 2) -> None:
    """Give every library the same thread count before any of them starts its pool."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(n))


def best_time(fn: Callable[[], object], repeats: int = 7, number: int = 200) -> float:
    """Seconds per call: the best of `repeats` runs of `number` calls (least noise)."""
    fn()  # warm up caches and lazy imports
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def best_times(fns: dict[str, Callable[[], object]], repeats: int = 7,
               number: int = 200) -> dict[str, float]:
    """Seconds per call for each of `fns`: the best of `repeats` runs of `number` calls,
    the contenders taking turns run by run, so that a machine whose speed drifts
    during the benchmark (these do, by a factor of 1.5 at times) slows every contender
    alike instead of whichever ran during the slow spell."""
    for fn in fns.values():
        fn()  # warm up caches and lazy imports
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(number):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / number)
    return best


def wanted(case: str) -> bool:
    """Whether this process times `case`: always, except in an --alone process."""
    return ALONE is None or ALONE.split("|")[0] == case


def both_ways(fns: dict[str, Callable[[], object]], repeats: int = 7,
              number: int = 200, case: str = "") -> dict[str, dict[str, float]]:
    """Seconds per call for each of `fns`, measured two ways in one run: "alone" (each
    contender's runs back to back, `best_time`) and "turns" (`best_times`). Taking
    turns evens out the machine's slow spells, but whoever runs right after pullback
    measures slower there: OpenBLAS's idle worker spins on one of the two cores for
    about 0.1 s after each of pullback's GEMMs (`bench/blas_spin.py`; PyTorch's OpenMP
    workers spin for about 10 ms). The "alone" figures are the fair ratio; turns flatter
    pullback.

    With --processes on the command line, each contender's "alone" runs happen in a
    process of its own (this program again, with --alone="case|name"), where no other
    contender has run: in one process, a plan's steps right after PyTorch's were often
    1.5x slower. That process prints its time and exits here. The contenders' processes
    take turns, ROUNDS rounds (--rounds=N), each contender's best kept: the machine's
    speed drifts by up to 1.5x over minutes, and one process each put ResNet-20's ratio
    anywhere from 0.87 to 1.2 from run to run."""
    if ALONE is not None:
        name = ALONE.split("|", 1)[1]
        print(json.dumps(best_time(fns[name], repeats, number)))
        sys.exit(0)
    if "--processes" in sys.argv:
        alone = {name: float("inf") for name in fns}
        for _ in range(ROUNDS):
            for name in fns:
                alone[name] = min(alone[name], _alone_in_own_process(case, name))
    else:
        alone = {name: best_time(fn, repeats, number) for name, fn in fns.items()}
    return {"alone": alone, "turns": best_times(fns, repeats, number)}


def _alone_in_own_process(case: str, name: str) -> float:
    argv = [sys.executable, sys.argv[0]] + [a for a in sys.argv[1:] if a != "--processes"]
    done = subprocess.run(argv + [f"--alone={case}|{name}"], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"timing {name!r} alone failed:\n{done.stderr}")
    return float(done.stdout.strip().splitlines()[-1])


def profile(step: Callable[[], object], steps: int, top: int, label: str = "") -> None:
    """cProfile of `steps` calls of step (after one unprofiled call): Python calls and
    ms per step, then the `top` functions with the most own time."""
    import cProfile
    import pstats

    step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    stats = pstats.Stats(prof)
    print(f"cProfile{', ' + label if label else ''}, {steps} plan steps: "
          f"{stats.total_calls // steps} Python calls per step, "
          f"{stats.total_tt / steps * 1e3:.2f} ms per step (profiled)")
    stats.sort_stats("tottime").print_stats(top)


def plan_sgd_step(model: object, x: object, y: object, lr: float,
                  momentum: float) -> Callable[[], object]:
    """One SGD-momentum step of `model` on (x, y) through a TRAINING plan, returning the
    loss (imports pullback only when called, after the threads are pinned)."""
    import pullback as pb
    from pullback import nn, optim

    opt = optim.SGD(model.parameters(), lr, momentum=momentum)
    plan = pb.compile(lambda x, y: nn.cross_entropy(model(x), y), x, y,
                      mode=pb.LoweringMode.TRAINING)

    def step() -> object:
        opt.zero_grad()
        loss = plan(x, y)
        opt.step()
        return loss

    return step


def eager_sgd_step(model: object, x: object, y: object, lr: float,
                   momentum: float) -> Callable[[], object]:
    """The same step through eager autograd (`loss.backward()`), returning the loss."""
    import pullback as pb
    from pullback import nn, optim

    opt = optim.SGD(model.parameters(), lr, momentum=momentum)

    def step() -> object:
        opt.zero_grad()
        loss = nn.cross_entropy(model(pb.tensor(x)), y)
        loss.backward()
        opt.step()
        return loss

    return step


def torch_sgd_step(tmodel: object, weights_from: object | None, x: object, y: object,
                   lr: float, momentum: float) -> Callable[[], object]:
    """One SGD-momentum step of the PyTorch `tmodel`, returning the loss; its parameters
    first copied from the pullback module `weights_from` in order (same data, same
    start), unless None (the caller loaded them)."""
    import torch

    if weights_from is not None:
        with torch.no_grad():
            for tp, p in zip(tmodel.parameters(), weights_from.parameters()):
                tp.copy_(torch.from_numpy(p.numpy().copy()))
    opt = torch.optim.SGD(tmodel.parameters(), lr, momentum=momentum)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step() -> object:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tmodel(xt), yt)
        loss.backward()
        opt.step()
        return loss

    return step
