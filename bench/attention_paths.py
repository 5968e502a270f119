"""Causal attention forward+backward at the GPT bench's size, three ways in one process.

q, k, v and the output gradient of shape (16, 4, 128, 32), float32, laid out as the
GPT's heads are (transposed views of (16, 128, 4, 32)): CpuBackend's NumPy form
(`CpuAttentionOps`), AttentionOps' forward-op defaults on the same backend (the path
every call took before), and PyTorch's `F.scaled_dot_product_attention` with
`backward`. CPU time of this process per call, best of the repeats, the three taking
turns (steadier than wall time on a shared machine; fair on one thread). Run: `python
bench/attention_paths.py [threads]`.
"""

from __future__ import annotations

import sys
import time

from common import pin_threads

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 1
pin_threads(THREADS)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pullback.backend import CpuBackend  # noqa: E402
from pullback.backend.attention import AttentionOps  # noqa: E402

N, H, T, D = 16, 4, 128, 32
REPEATS, NUMBER = 15, 3


class Defaults(CpuBackend):
    """CpuBackend with AttentionOps' forward-op defaults."""

    attention = AttentionOps.attention
    attention_backward = AttentionOps.attention_backward


def main() -> None:
    torch.set_num_threads(THREADS)
    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((N, T, H, D)).astype(np.float32).transpose(0, 2, 1, 3)
                  for _ in range(4))
    scale = 1.0 / np.sqrt(D).item()

    def run(backend: CpuBackend) -> None:
        backend.attention(q, k, v, None, None, scale, True)
        backend.attention_backward(g, q, k, v, None, None, scale, True, False)

    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    tg = torch.tensor(g)

    def torch_run() -> None:
        tq.grad = tk.grad = tv.grad = None
        F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(tg)

    fast, slow = CpuBackend(), Defaults()
    fns = {"numpy form": lambda: run(fast), "forward-op defaults": lambda: run(slow),
           "torch": torch_run}
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()
    for _ in range(REPEATS):
        for name, fn in fns.items():
            start = time.process_time()
            for _ in range(NUMBER):
                fn()
            best[name] = min(best[name], (time.process_time() - start) / NUMBER)
    print(f"causal attention forward+backward, (N, H, T, D) = {(N, H, T, D)} float32, "
          f"{THREADS} thread(s), CPU ms per call: " + ", ".join(
              f"{name} {t * 1e3:.2f}" for name, t in best.items()))
    print(f"numpy form / torch {best['numpy form'] / best['torch']:.2f}, forward-op defaults "
          f"/ torch {best['forward-op defaults'] / best['torch']:.2f}")


if __name__ == "__main__":
    main()
