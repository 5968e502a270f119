"""Would a training plan gain by keeping the forward's im2col columns for the weight
gradient (issue 15), instead of building them again chunk by chunk?

For each 3x3 stride-1 convolution of ResNet-20 (batch 64), in one process, best of
repeats: today's forward and weight backward (pullback.backend.conv: each chunk's
windows built in a reused, cache-sized buffer, twice), against a forward that writes
each chunk's windows into a kept whole-batch buffer (in the layout its GEMM reads) and
a weight backward that reads them from there, with the same GEMMs. The saving per step
is count x (forward + weight backward, today - kept); the memory is the kept buffer.

Run: `python bench/conv_columns.py [--threads=1]`.
"""

from __future__ import annotations

import sys
import time

from common import pin_threads

THREADS = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--threads=")), 1))
pin_threads(THREADS)

import numpy as np  # noqa: E402

from pullback.backend import conv as bc  # noqa: E402
from pullback.kernels import conv as kc  # noqa: E402

BATCH = 64
# ResNet-20's 3x3 stride-1 convolutions: (in, out, size, count).
CONVS = [(3, 16, 32, 1), (16, 16, 32, 6), (32, 32, 16, 5), (64, 64, 8, 5)]


def best(fn: object, repeats: int = 15) -> float:
    fn()
    least = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        least = min(least, time.perf_counter() - start)
    return least * 1e3


def kept_ways(x: np.ndarray, w: np.ndarray, u: np.ndarray) -> tuple:
    """(forward keeping the columns, weight backward reading them), mirroring the two
    paths of pullback.backend.conv: per-sample GEMMs where a sample has more pixels than
    im2col rows, one GEMM per chunk (windows channels outer) otherwise."""
    n, cin, size = x.shape[0], x.shape[1], x.shape[2]
    cout = w.shape[0]
    win = bc.check_conv(x, w, (1, 1), (1, 1))
    pixels, rows = size * size, cin * 9
    chunks = bc._chunks(n, rows * pixels * x.itemsize)
    kept = np.empty(n * rows * pixels, x.dtype)
    weight = w.reshape(1, cout, rows)
    y = np.empty((n, cout, size, size), x.dtype)
    out = y.reshape(n, 1, cout, pixels)
    up = u.reshape(n, 1, cout, pixels)
    scratch = np.empty(chunks[0][1] * cout * pixels, x.dtype)
    if rows <= pixels and pixels >= bc.CHUNK_GEMM_PIXELS:
        samples = kept.reshape(n, cin, 3, 3, size, size)
        geo = win.geometry(samples[:1])

        def forward() -> None:
            for a, b in chunks:
                kc.unfold(x[a:b], samples[a:b], geo, 0.0)
                np.matmul(weight, samples[a:b].reshape(b - a, 1, rows, pixels), out=out[a:b])

        def weight_backward() -> np.ndarray:
            grad = np.zeros((1, cout, rows), x.dtype)
            for a, b in chunks:
                cols = samples[a:b].reshape(b - a, 1, rows, pixels)
                grad += np.matmul(up[a:b], cols.transpose(0, 1, 3, 2)).sum(0)
            return grad.reshape(w.shape)

        return forward, weight_backward

    def forward() -> None:
        for a, b in chunks:
            m = b - a
            cols = bc._windows_channels_outer(x[a:b], win, kept[a * rows * pixels:])
            product = scratch[:m * cout * pixels].reshape(1, cout, m * pixels)
            np.matmul(weight, cols.reshape(1, rows, m * pixels), out=product)
            np.copyto(out[a:b], product.reshape(1, cout, m, pixels).transpose(2, 0, 1, 3))

    def weight_backward() -> np.ndarray:
        grad = np.zeros((1, rows, cout), x.dtype)
        for a, b in chunks:
            m = b - a
            cols = kept[a * rows * pixels:b * rows * pixels].reshape(1, rows, m * pixels)
            ups = scratch[:m * cout * pixels].reshape(1, cout, m, pixels)
            np.copyto(ups, up[a:b].transpose(1, 2, 0, 3))
            grad += np.matmul(cols, ups.reshape(1, cout, m * pixels).transpose(0, 2, 1))
        return np.ascontiguousarray(grad.transpose(0, 2, 1)).reshape(w.shape)

    return forward, weight_backward


def measure(x: np.ndarray, w: np.ndarray, u: np.ndarray) -> dict:
    """ms of the forward and weight backward, today's and keeping the columns, after
    checking the kept way's weight gradient against today's."""
    forward, weight_backward = kept_ways(x, w, u)
    forward()
    np.testing.assert_allclose(weight_backward(),
                               bc.conv2d_weight_backward(u, x, w.shape, (1, 1), (1, 1)),
                               rtol=1e-4, atol=1e-3)
    return {"fwd": best(lambda: bc.conv2d(x, w, (1, 1), (1, 1))), "fwd kept": best(forward),
            "dw": best(lambda: bc.conv2d_weight_backward(u, x, w.shape, (1, 1), (1, 1))),
            "dw kept": best(weight_backward)}


def main() -> int:
    rng = np.random.default_rng(0)
    total = {"today": 0.0, "kept": 0.0}
    memory = 0
    print(f"{THREADS} thread(s), ms per call, batch {BATCH}")
    for cin, cout, size, count in CONVS:
        x = rng.standard_normal((BATCH, cin, size, size)).astype(np.float32)
        w = rng.standard_normal((cout, cin, 3, 3)).astype(np.float32)
        u = rng.standard_normal((BATCH, cout, size, size)).astype(np.float32)
        t = measure(x, w, u)
        total["today"] += count * (t["fwd"] + t["dw"])
        total["kept"] += count * (t["fwd kept"] + t["dw kept"])
        mb = BATCH * cin * 9 * size * size * 4 / 2**20
        memory += count * mb
        print(f"conv {cin}->{cout} 3x3 at {size}x{size} (x{count}): " + ", ".join(
            f"{k} {v:.2f}" for k, v in t.items()) + f"; kept columns {mb:.1f} MB", flush=True)
    print(f"per step: today {total['today']:.1f} ms, kept {total['kept']:.1f} ms, "
          f"kept columns {memory:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
