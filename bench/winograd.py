"""Winograd F(4x4, 3x3) against im2col + GEMM, per convolution shape, 2 threads.

For each 3x3, stride-1, padding-1 convolution of the shapes that matter (the digits
CNN's second at batch 128, bench/plans.py's CNN on 3x32x32, ResNet-20's stages,
ResNet-50's 3x3 stride-1 layers at batch 1): the backend's conv2d and
conv2d_input_backward through im2col (Winograd switched off) and through Winograd
(forced on), the two taking turns (bench/common.py `best_times`), and each float32
result's largest error against the float64 reference, as a multiple of the im2col
result's (and, for the forward, relative to the reference's largest value). Also
that error for F(2x2, 3x3), from a NumPy model of it. With one thread (`--threads=1`)
the times are CPU times of the calling thread, steady under load.

Run: `python bench/winograd.py` (`--quick` for fewer repeats, `--threads=1` for one
thread, `--only=resnet50` for the shapes whose name holds that word).
"""

from __future__ import annotations

import sys
import time
from functools import partial

from common import best_times, pin_threads

THREADS = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--threads=")), 2))
pin_threads(THREADS)

import numpy as np  # noqa: E402

from pullback.backend import conv  # noqa: E402

QUICK = "--quick" in sys.argv
SHAPES = {  # name: (batch, in channels, out channels, map side)
    "digits conv2 32->64 @4": (128, 32, 64, 4),
    "cnn conv1 3->32 @32": (64, 3, 32, 32),
    "cnn conv2 32->64 @16": (64, 32, 64, 16),
    "resnet20 16 @32": (64, 16, 16, 32),
    "resnet20 32 @16": (64, 32, 32, 16),
    "resnet20 64 @8": (64, 64, 64, 8),
    "resnet50 64 @56": (1, 64, 64, 56),
    "resnet50 128 @28": (1, 128, 128, 28),
    "resnet50 256 @14": (1, 256, 256, 14),
    "resnet50 512 @7": (1, 512, 512, 7),
}
PAD = (1, 1)


def forced(value: bool | None) -> None:
    """Make conv2d's choice always Winograd (True), never (False), or its rule (None)."""
    conv.WINOGRAD_FORCED = value


def cpu_turns(fns: dict, repeats: int, number: int) -> dict[str, float]:
    """best_times, in CPU seconds of the calling thread: with one thread (all the work
    on the caller), steady when other jobs share the machine."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.thread_time()
            for _ in range(number):
                fn()
            best[name] = min(best[name], (time.thread_time() - start) / number)
    return best


def timed(fn: object, forced_to: bool) -> object:
    def run() -> object:
        forced(forced_to)
        return fn()
    return run


def f2x2_error(x: np.ndarray, w: np.ndarray, reference: np.ndarray) -> float:
    """Largest error of F(2x2, 3x3) in float32 arithmetic (a NumPy model: transforms as
    small matrix products, the same GEMM in float32) against the float64 reference."""
    bt = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float32)
    g = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float32)
    at = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float32)
    n, c, h, _ = x.shape
    th = -(-h // 2)
    padded = np.zeros((n, c, 2 * th + 2, 2 * th + 2), np.float32)
    padded[:, :, 1:h + 1, 1:h + 1] = x
    view = np.lib.stride_tricks.sliding_window_view(padded, (4, 4), (2, 3))[:, :, ::2, ::2]
    v = bt @ view @ bt.T  # (n, c, th, th, 4, 4)
    u = g @ w @ g.T  # (o, c, 4, 4)
    m = np.einsum("ocab,ncyxab->noyxab", u, v, optimize=True)
    y = (at @ m @ at.T).transpose(0, 1, 2, 4, 3, 5).reshape(n, -1, 2 * th, 2 * th)
    return float(np.abs(y[:, :, :h, :h] - reference).max())


def main() -> None:
    rng = np.random.default_rng(0)
    repeats, number = (3, 3) if QUICK else (7, 5)
    print("| shape | forward im2col | forward Winograd | ratio | input grad im2col | "
          "input grad Winograd | ratio | f32 error / im2col's: F(4x4) fwd, bwd, F(2x2) fwd | "
          "F(4x4) fwd error / max |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    only = next((a.split("=")[1] for a in sys.argv if a.startswith("--only=")), "")
    for name, (n, c, o, side) in SHAPES.items():
        if only not in name:
            continue
        # He-initialised weights on unit inputs: the value scale of a trained net's layers.
        x = rng.standard_normal((n, c, side, side)).astype(np.float32)
        w = (rng.standard_normal((o, c, 3, 3)) * np.sqrt(2 / (9 * c))).astype(np.float32)
        up = rng.standard_normal((n, o, side, side)).astype(np.float32)
        out = np.empty((n, o, side, side), np.float32)
        grad = np.empty(x.shape, np.float32)
        fwd = partial(conv.conv2d, x, w, (1, 1), PAD, out=out)
        bwd = partial(conv.conv2d_input_backward, up, w, x.shape, (1, 1), PAD, out=grad)
        contenders = {"fwd old": timed(fwd, False), "fwd new": timed(fwd, True),
                      "bwd old": timed(bwd, False), "bwd new": timed(bwd, True)}
        times = (cpu_turns if THREADS == 1 else best_times)(contenders, repeats, number)
        errors = []
        for fn, args in ((conv.conv2d, (x, w, (1, 1), PAD)),
                         (conv.conv2d_input_backward, (up, w, x.shape, (1, 1), PAD))):
            wide = [a.astype(np.float64) if isinstance(a, np.ndarray) else a for a in args]
            reference = fn(*wide)
            forced(False)
            old = np.abs(fn(*args) - reference).max()
            forced(True)
            new = np.abs(fn(*args) - reference).max()
            errors.append(new / old)
            if fn is conv.conv2d:
                f2 = f2x2_error(x, w, reference) / old
                relative = new / np.abs(reference).max()
        forced(None)
        ms = {k: v * 1e3 for k, v in times.items()}
        print(f"| {name}, batch {n} | {ms['fwd old']:.2f} | {ms['fwd new']:.2f} | "
              f"{ms['fwd new'] / ms['fwd old']:.2f} | {ms['bwd old']:.2f} | {ms['bwd new']:.2f} "
              f"| {ms['bwd new'] / ms['bwd old']:.2f} | {errors[0]:.1f}, {errors[1]:.1f}, "
              f"{f2:.1f} | {relative:.1e} |", flush=True)


if __name__ == "__main__":
    main()
