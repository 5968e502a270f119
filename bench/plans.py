"""Training plans against PyTorch eager: wide MLP, CNN on 3x32x32, memory, threads.

Each model trains one step at a time with SGD + momentum, pullback through a
TRAINING plan (`pb.compile`) and PyTorch eager, in one run on the same data
and initial weights, every library on 2 threads. Peak memory growth of one
step is measured in a fresh process per framework (maximum resident set
size after the step minus before it). Run: `python bench/plans.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys

from common import best_times, both_ways, pin_threads, plan_sgd_step, torch_sgd_step

pin_threads(2)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from cnn_models import cifar_cnn, train_cnn  # noqa: E402

import pullback as pb  # noqa: E402
from pullback import nn  # noqa: E402

LR, MOMENTUM = 0.01, 0.9


def wide_mlp() -> tuple:
    pb.manual_seed(0)
    model = nn.Sequential(nn.Dense(784, 1024), nn.ReLU(), nn.Dense(1024, 1024), nn.ReLU(),
                          nn.Dense(1024, 10))
    tmodel = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                 torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                 torch.nn.Linear(1024, 10))
    return model, tmodel, (256, 784)


MODELS = {"MLP 784-1024-1024-10, batch 256": wide_mlp, "CNN on 3x32x32, batch 64": cifar_cnn,
          "CNN on 1x8x8, batch 32 (train's)": train_cnn}


def steps(make: object) -> tuple:
    model, tmodel, shape = make()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, shape[0])
    torch_step = torch_sgd_step(tmodel, model, x, y, LR, MOMENTUM)
    return plan_sgd_step(model, x, y, LR, MOMENTUM), torch_step


def memory_growth(framework: str, warm: bool) -> float:
    """MiB the resident set peaks above its size before one wide-MLP step (the first
    step, or one after a warm-up step), in a fresh process. The kernel's high-water
    mark is reset just before the step (/proc/self/clear_refs), so what setup and
    tracing touched earlier does not hide the step's own peak."""
    code = f"""
import sys, json
sys.path.insert(0, {str(__file__.rsplit('/', 1)[0])!r})
import plans
pullback_step, torch_step = plans.steps(plans.wide_mlp)
step = pullback_step if {framework!r} == "pullback" else torch_step
if {warm!r}:
    step()
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS:")
step()
print(json.dumps(status("VmHWM:") - before))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def _on(backend: pb.Backend, fn: object) -> object:
    def run() -> None:
        with pb.use_backend(backend):
            fn()

    return run


def threads() -> list[str]:
    x = np.random.default_rng(0).standard_normal(4_000_000).astype(np.float32)
    cpu, threaded = pb.CpuBackend(), pb.ThreadedCpuBackend(num_threads=2)
    lines = []
    for name, fn in (("gelu", pb.gelu), ("sigmoid", pb.sigmoid), ("exp", pb.exp),
                     ("softmax rows", lambda t: pb.softmax(t.reshape(4000, 1000)))):
        t = pb.tensor(x)
        call = lambda fn=fn, t=t: fn(t)
        times = best_times({"cpu": _on(cpu, call), "threaded": _on(threaded, call)},
                           repeats=5, number=5)
        lines.append(f"  {name:13s} (4M float32): cpu {times['cpu'] * 1e3:6.2f} ms, threaded "
                     f"{times['threaded'] * 1e3:6.2f} ms, speed-up "
                     f"{times['cpu'] / times['threaded']:.2f}x")
    pullback_step, _ = steps(wide_mlp)
    times = best_times({"cpu": _on(cpu, pullback_step), "threaded": _on(threaded, pullback_step)},
                       repeats=5, number=10)
    lines.append(f"  wide MLP step: cpu {times['cpu'] * 1e3:.2f} ms, threaded "
                 f"{times['threaded'] * 1e3:.2f} ms, speed-up "
                 f"{times['cpu'] / times['threaded']:.2f}x")
    return lines


def main() -> int:
    torch.set_num_threads(2)
    print("training step, SGD momentum, float32, pullback TRAINING plan vs PyTorch eager")
    print("  (best run of each; 'alone': each contender's runs back to back, 'turns': the")
    print("  contenders alternating run by run)")
    for label, make in MODELS.items():
        pullback_step, torch_step = steps(make)
        ways = both_ways({"pullback": pullback_step, "pytorch": torch_step}, repeats=7,
                         number=10 if make is not train_cnn else 100)
        for way, times in ways.items():
            tp, tt = times["pullback"], times["pytorch"]
            print(f"  {label:34s} {way:5s}  pullback {tp * 1e3:7.2f} ms, pytorch "
                  f"{tt * 1e3:7.2f} ms, ratio {tp / tt:.2f}")
    for warm in (False, True):
        growth = {f: memory_growth(f, warm) for f in ("pullback", "pytorch")}
        print(f"peak memory growth of {'a warm' if warm else 'the first'} wide-MLP step: "
              f"pullback {growth['pullback']:.1f} MiB, pytorch {growth['pytorch']:.1f} MiB")
    print("ThreadedCpuBackend(2) against CpuBackend:")
    for line in threads():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
