"""A GPT training step (AdamW) against PyTorch eager, every library on 2 threads.

pullback.gpt's `GPT` (d_model 128, 4 layers, 4 heads, context 128, vocab 96) on batches
of 16 windows, the loss the cross-entropy over (batch * time, vocab) as the gpt job's,
AdamW (lr 3e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01), against its PyTorch
twin (nn.Embedding x2, nn.TransformerEncoderLayer(norm_first=True, activation="gelu",
dropout=0), nn.LayerNorm, nn.Linear) holding the same weights. Contenders: the step
through a TRAINING plan, the step through eager autograd, and PyTorch's eager step.

Before timing, each contender runs 10 steps from the same weights on the same
batches; the losses must agree with PyTorch's to 1e-5 relative. Prints JSON: ms per
step (wall time alone and taking turns, and CPU time taking turns, the steadiest on
a shared machine) and torch / pullback ratios. Run: `python bench/gpt_step.py
[threads]` (`1` for one thread each, where CPU time compares fairly).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from common import both_ways, pin_threads

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
pin_threads(THREADS)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from twins import TorchGPT, twin_of  # noqa: E402

import pullback as pb  # noqa: E402
from pullback import optim  # noqa: E402
from pullback.gpt import GPT, _loss  # noqa: E402

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS, BATCH = 96, 128, 128, 4, 4, 16
ADAMW = {"lr": 3e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
CHECK_STEPS, RTOL = 10, 1e-5


def torch_loss(twin: TorchGPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = twin(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             y.reshape(-1))


def batches(count: int) -> list[np.ndarray]:
    """`count` (BATCH, CONTEXT + 1) windows of ids: inputs [:, :-1], targets [:, 1:]."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, VOCAB, (BATCH, CONTEXT + 1)) for _ in range(count)]


def contenders() -> dict:
    pb.manual_seed(0)
    start = GPT(VOCAB, CONTEXT, WIDTH, HEADS, LAYERS)
    weights = {k: v.numpy().copy() for k, v in start.state_dict().items()}

    def fresh() -> GPT:
        model = GPT(VOCAB, CONTEXT, WIDTH, HEADS, LAYERS)
        model.load_state_dict({k: pb.tensor(v.copy()) for k, v in weights.items()})
        return model

    data = batches(CHECK_STEPS)

    plan_model = fresh()
    plan_opt = optim.AdamW(plan_model.parameters(), **ADAMW)
    plan = pb.compile(lambda x, y: _loss(plan_model, x, y), data[0][:, :-1], data[0][:, 1:],
                      mode=pb.LoweringMode.TRAINING)

    def plan_step(window: np.ndarray) -> float:
        plan_opt.zero_grad()
        loss = plan(window[:, :-1], window[:, 1:])
        plan_opt.step()
        return loss

    eager_model = fresh()
    eager_opt = optim.AdamW(eager_model.parameters(), **ADAMW)

    def eager_step(window: np.ndarray) -> float:
        eager_opt.zero_grad()
        loss = _loss(eager_model, pb.tensor(window[:, :-1]), window[:, 1:])
        loss.backward()
        eager_opt.step()
        return loss

    twin = twin_of(start)
    torch_opt = torch.optim.AdamW(twin.parameters(), **ADAMW)

    def torch_step(window: np.ndarray) -> float:
        torch_opt.zero_grad()
        w = torch.from_numpy(window)
        loss = torch_loss(twin, w[:, :-1], w[:, 1:])
        loss.backward()
        torch_opt.step()
        return loss

    steps = {"pullback plan": plan_step, "pullback eager": eager_step,
             "torch eager": torch_step}
    losses = {name: [float(step(w).item()) for w in data] for name, step in steps.items()}
    expected = np.array(losses["torch eager"])
    worst = {}
    for name in ("pullback plan", "pullback eager"):
        relative = np.abs(np.array(losses[name]) - expected) / np.abs(expected)
        worst[name] = float(relative.max())
        if worst[name] > RTOL:
            raise SystemExit(f"{name}: losses differ from PyTorch's by {worst[name]:.2e} "
                             f"relative (> {RTOL}):\n{losses[name]}\n{losses['torch eager']}")
    window = data[-1]
    return ({name: (lambda step=step: step(window)) for name, step in steps.items()},
            {"losses": losses, "worst relative difference": worst})


def cpu_times(fns: dict[str, Callable[[], object]], repeats: int = 5,
              number: int = 3) -> dict[str, float]:
    """CPU seconds of this process per call, contenders taking turns (best of `repeats`
    runs of `number`): steadier than wall time on a machine other jobs share, though a
    library whose idle threads spin is charged for the spinning."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.process_time()
            for _ in range(number):
                fn()
            best[name] = min(best[name], (time.process_time() - start) / number)
    return best


def main() -> None:
    torch.set_num_threads(THREADS)
    fns, check = contenders()
    times = both_ways(fns, repeats=5, number=3)
    times["cpu time, turns"] = cpu_times(fns)
    ms = {way: {name: round(t * 1e3, 2) for name, t in ts.items()} for way, ts in times.items()}
    ratios = {way: {name: round(ts["torch eager"] / ts[name], 2)
                    for name in ("pullback plan", "pullback eager")}
              for way, ts in times.items()}
    print(json.dumps({
        "threads": THREADS,
        "shape": {"vocab": VOCAB, "context": CONTEXT, "d_model": WIDTH, "heads": HEADS,
                  "layers": LAYERS, "batch": BATCH},
        "losses after 10 steps": {k: v[-1] for k, v in check["losses"].items()},
        "worst relative loss difference over 10 steps": check["worst relative difference"],
        "ms per step": ms, "torch / pullback": ratios}, indent=2))


if __name__ == "__main__":
    main()
