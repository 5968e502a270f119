"""Greedy generation, tokens per second: pullback's `generate` (a cache of past keys and
values) against the same GPT in PyTorch with a hand-written cache, and both without a
cache (a full forward over the window for every token), every library on 2 threads.

Two shapes: `pullback train --model gpt`'s default (width 128, 2 layers, 4 heads,
context 64) and the issue's GPT (width 128, 4 layers, 4 heads, context 128); vocabulary
100, random weights (the same in both libraries), a 4-id prompt, 200 new ids, so the
window restarts (at the last context // 2 ids, as `generate` documents) in both
shapes. Every contender must produce the same ids. Wall time as the other benchmarks
(each contender alone, and taking turns), and processor time, steadier on a shared
machine. Run: `python bench/generate.py` (`python bench/generate.py 1` for one thread
each; on a loaded machine two OpenBLAS threads can spin far longer than they compute).
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
from pullback.gpt import GPT, generate  # noqa: E402

VOCAB, WIDTH, HEADS, TOKENS = 100, 128, 4, 200
PROMPT = [1, 2, 3, 4]
SHAPES = {"train --model gpt default (2 layers, context 64)": (2, 64),
          "issue's GPT (4 layers, context 128)": (4, 128)}


def torch_cached(twin: TorchGPT, layers: int, context: int) -> list[int]:
    """Greedy ids through the twin's cache, with `generate`'s window (restart at the
    last context // 2 ids when full)."""
    cache = twin.new_cache()
    ids, length, new = list(PROMPT), 0, PROMPT[-context:]
    with torch.no_grad():
        for _ in range(TOKENS):
            if length + len(new) > context:
                length, new = 0, ids[-(context // 2):]
            logits = twin.step(torch.tensor([new]), cache, length)
            length += len(new)
            new = [int(logits[0, -1].argmax())]
            ids += new
    return ids


def uncached(forward: Callable[[list[int]], np.ndarray], context: int) -> list[int]:
    """Greedy ids from a full forward (ids -> last logits) over the same windows."""
    ids, start = list(PROMPT), max(0, len(PROMPT) - context)
    for _ in range(TOKENS):
        if len(ids) - start > context:
            start = len(ids) - context // 2
        ids.append(int(forward(ids[start:]).argmax()))
    return ids


def contenders(layers: int, context: int) -> dict[str, Callable[[], list[int]]]:
    pb.manual_seed(0)
    model = GPT(VOCAB, context, WIDTH, HEADS, layers)
    model.eval()
    twin = twin_of(model).eval()

    def pullback_forward(window: list[int]) -> np.ndarray:
        with pb.no_grad():
            return model(pb.tensor(np.asarray([window]))).numpy()[0, -1]

    def torch_forward(window: list[int]) -> np.ndarray:
        with torch.no_grad():
            return twin(torch.tensor([window]))[0, -1].numpy()

    runs = {
        "pullback cached": lambda: generate(model, PROMPT, TOKENS, temperature=0,
                                            rng=np.random.default_rng(0)),
        "torch cached": lambda: torch_cached(twin, layers, context),
        "pullback uncached": lambda: uncached(pullback_forward, context),
        "torch uncached": lambda: uncached(torch_forward, context),
    }
    ids = {name: run() for name, run in runs.items()}
    for name, got in ids.items():
        assert got == ids["torch uncached"], f"{name} generated other ids"
    return runs


def best_cpu_time(fn: Callable[[], object], repeats: int) -> float:
    """The least processor time of `repeats` calls (all threads of the process): on a
    machine shared with other jobs, wall time also counts the waits for a core."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    torch.set_num_threads(THREADS)
    results = {}
    for label, (layers, context) in SHAPES.items():
        runs = contenders(layers, context)
        times = both_ways(runs, repeats=3, number=1)
        times["processor time, alone"] = {name: best_cpu_time(run, 3)
                                          for name, run in runs.items()}
        rates = {way: {name: round(TOKENS / t, 1) for name, t in ts.items()}
                 for way, ts in times.items()}
        results[label] = {"tokens/s": rates}
        for way in ("alone", "processor time, alone"):
            rate = rates[way]
            results[label][f"ratios ({way})"] = {
                "pullback / torch tokens/s, cached": round(rate["pullback cached"]
                                                           / rate["torch cached"], 2),
                "pullback / torch tokens/s, uncached": round(rate["pullback uncached"]
                                                             / rate["torch uncached"], 2),
                "cache speed-up, pullback": round(rate["pullback cached"]
                                                  / rate["pullback uncached"], 2),
                "cache speed-up, torch": round(rate["torch cached"] / rate["torch uncached"],
                                               2),
            }
    print(json.dumps({"threads": THREADS, "vocab": VOCAB, "width": WIDTH, "heads": HEADS,
                      "prompt ids": len(PROMPT), "new ids": TOKENS,
                      "greedy tokens per second (higher is faster)": results}, indent=2))


if __name__ == "__main__":
    main()
