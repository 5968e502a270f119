"""im2col and col2im split over BLAS's threads (pullback.kernels.split) against the same
kernels on the calling thread, in one process, the two ways taking turns run by run:
ResNet-20's convolutions one by one (forward, input and weight backward), the ResNet-20
training-step plan and the 3x32x32 CNN plan of bench/plans.py, PyTorch eager beside them.

"serial" sets `split.PARALLEL_ELEMENTS` above every size, so nothing is split; "split"
is the shipped threshold. The results are bit for bit the same either way (tested in
tests/kernels/test_kernel_split.py); only the time differs.

Run: `python bench/conv_split.py [--threads=2] [--layers] [--steps]` (both by default).
"""

from __future__ import annotations

import json
import sys

from common import best_time, pin_threads, plan_sgd_step, torch_sgd_step

THREADS = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--threads=")), 2))
pin_threads(THREADS)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pullback.kernels import split  # noqa: E402

SHIPPED = split.PARALLEL_ELEMENTS
WAYS = {"serial": 1 << 62, "split": SHIPPED}


def turns(fns: dict, repeats: int, number: int) -> dict:
    """ms per call of each (way, name) in fns, the best of `repeats`, ways taking turns."""
    best = dict.fromkeys(((w, n) for w in WAYS for n in fns), float("inf"))
    for _ in range(repeats):
        for way, threshold in WAYS.items():
            split.PARALLEL_ELEMENTS = threshold
            for name, fn in fns.items():
                best[way, name] = min(best[way, name], best_time(fn, 1, number) * 1e3)
    split.PARALLEL_ELEMENTS = SHIPPED
    return best


def conv_fns(be: object, x: np.ndarray, w: np.ndarray, u: np.ndarray, st: tuple,
             pd: tuple) -> dict:
    """A convolution's forward, input and weight backward on backend `be`."""
    return {"fwd": lambda: be.conv2d(x, w, st, pd),
            "dx": lambda: be.conv2d_input_backward(u, w, x.shape, st, pd),
            "dw": lambda: be.conv2d_weight_backward(u, x, w.shape, st, pd)}


def layers() -> None:
    from resnet20 import BATCH, CONVS

    from pullback.backend import CpuBackend

    be = CpuBackend()
    rng = np.random.default_rng(0)
    total = dict.fromkeys(WAYS, 0.0)
    for cin, cout, k, stride, size, count in CONVS:
        pad, out = k // 2, size // stride
        x = rng.standard_normal((BATCH, cin, size, size)).astype(np.float32)
        w = rng.standard_normal((cout, cin, k, k)).astype(np.float32)
        u = rng.standard_normal((BATCH, cout, out, out)).astype(np.float32)
        fns = conv_fns(be, x, w, u, (stride, stride), (pad, pad))
        best = turns(fns, 5, 3)
        for way in WAYS:
            total[way] += count * sum(best[way, name] for name in fns)
        print(f"conv {cin}->{cout} {k}x{k} s{stride} at {size}x{size} (x{count}): " + "; ".join(
            f"{way} " + " ".join(f"{best[way, name]:.2f}" for name in fns) for way in WAYS)
            + " ms (fwd dx dw)", flush=True)
    print("weighted by count, ms per step: " + ", ".join(f"{w} {t:.1f}" for w, t in total.items()))


def steps() -> None:
    import resnet20
    from plans import cnn

    torch.set_num_threads(THREADS)
    model, _, tmodel = resnet20.models()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((resnet20.BATCH, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, resnet20.BATCH)
    runs = {"ResNet-20": (plan_sgd_step(model, x, y, 0.01, 0.9),
                          torch_sgd_step(tmodel, None, x, y, 0.01, 0.9))}
    model, tmodel, shape = cnn()
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, shape[0])
    runs["CNN 3x32x32"] = (plan_sgd_step(model, x, y, 0.01, 0.9),
                           torch_sgd_step(tmodel, model, x, y, 0.01, 0.9))
    for name, (plan, torch_step) in runs.items():
        best = turns({"plan": plan, "torch": torch_step}, 3, 2 if name == "ResNet-20" else 10)
        print(json.dumps({name: {f"{way} plan ms": round(best[way, "plan"], 2) for way in WAYS}
                          | {"torch ms": round(min(best[w, "torch"] for w in WAYS), 2)}
                          | {f"torch / {way} plan": round(
                              min(best[w, "torch"] for w in WAYS) / best[way, "plan"], 2)
                              for way in WAYS}}), flush=True)


def main() -> int:
    chosen = [a for a in ("--layers", "--steps") if a in sys.argv] or ["--layers", "--steps"]
    print(f"{THREADS} threads; split threshold {SHIPPED} elements, BLAS threads "
          f"{split.blas_threads()}")
    if "--layers" in chosen:
        layers()
    if "--steps" in chosen:
        steps()
    return 0


if __name__ == "__main__":
    sys.exit(main())
