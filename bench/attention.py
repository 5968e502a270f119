"""scaled_dot_product_attention at a GPT-ish size: forward, and forward+backward.

q, k, v of shape (B=8, H=4, T=128, D=32), float32; plain and causal; pullback's
fused primitive against PyTorch eager (`F.scaled_dot_product_attention`), both on
two threads (or as many as the first argument says), in one run on the same data.
Prints milliseconds and pullback's time over PyTorch's. Run: `python bench/attention.py
[threads]`.
"""

from __future__ import annotations

import sys

from common import both_ways, pin_threads

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
pin_threads(THREADS)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import pullback as pb  # noqa: E402

SHAPE = (8, 4, 128, 32)


def contenders(causal: bool) -> dict[str, object]:
    rng = np.random.default_rng(0)
    q0, k0, v0, g0 = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(4))
    pq, pk, pv = (pb.tensor(a, requires_grad=True) for a in (q0, k0, v0))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q0, k0, v0))
    pg, tg = pb.tensor(g0), torch.tensor(g0)

    def pb_forward() -> None:
        with pb.no_grad():
            pb.scaled_dot_product_attention(pq, pk, pv, is_causal=causal)

    def pb_step() -> None:
        (pb.scaled_dot_product_attention(pq, pk, pv, is_causal=causal) * pg).sum().backward()

    def torch_forward() -> None:
        with torch.no_grad():
            F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

    def torch_step() -> None:
        F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(tg)

    return {"pullback forward": pb_forward, "torch forward": torch_forward,
            "pullback fwd+bwd": pb_step, "torch fwd+bwd": torch_step}


def main() -> None:
    torch.set_num_threads(THREADS)
    print(f"scaled_dot_product_attention, q k v {SHAPE} float32, {THREADS} thread(s)")
    for causal in (False, True):
        times = both_ways(contenders(causal), repeats=5, number=20)
        for how, ms in times.items():
            line = ", ".join(f"{name} {t * 1e3:.2f} ms" for name, t in ms.items())
            ratios = ", ".join(
                f"{what} {ms[f'pullback {what}'] / ms[f'torch {what}']:.2f}x"
                for what in ("forward", "fwd+bwd"))
            print(f"{'causal' if causal else 'full'} ({how}): {line}; pullback/torch {ratios}")


if __name__ == "__main__":
    main()
