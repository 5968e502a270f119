"""One training step of a recurrent classifier against PyTorch eager, every library on 2
threads: an LSTM (or GRU), batch first, a linear head over 10 classes on the last
step's output, cross-entropy, SGD with momentum 0.9.

The default case is the issue's: LSTM input 64 -> hidden 256, 32 steps, batch 64.
`--small` times small tensors instead, where per-call overhead dominates: LSTM and GRU
with input 16, hidden 32, 16 steps, batch 8 and batch 1. Contenders: pullback through a
TRAINING plan, pullback eager, PyTorch eager, the same initial weights (pullback's,
copied) and random data (fixed seed); three steps of each must give the same losses
(1e-4 relative, float32) before anything is timed.

Run: `python bench/lstm_step.py` or `python bench/lstm_step.py --small`; `--profile`
adds a cProfile of the plan step (Python calls per step, functions by own time);
`--processes` times each contender's "alone" runs in a process of its own; `--floor` adds
the time of the LSTM step's matrix products alone (`gemm_floor`).
"""

from __future__ import annotations

import json
import sys

from common import (
    ALONE,
    both_ways,
    eager_sgd_step,
    pin_threads,
    plan_sgd_step,
    profile,
    torch_sgd_step,
    wanted,
)

THREADS = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--threads=")), 2))
pin_threads(THREADS)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import pullback as pb  # noqa: E402
from pullback import nn  # noqa: E402

LR, MOMENTUM, CLASSES = 0.05, 0.9, 10
# (kind, batch, steps, input, hidden)
LARGE = [("LSTM", 64, 32, 64, 256)]
SMALL = [("LSTM", 8, 16, 16, 32), ("GRU", 8, 16, 16, 32), ("LSTM", 1, 16, 16, 32),
         ("GRU", 1, 16, 16, 32)]


class Net(nn.Module):
    """A recurrent layer, then a linear head on the last step's output."""

    def __init__(self, kind: str, inputs: int, hidden: int):
        super().__init__()
        self.rnn = getattr(nn, kind)(inputs, hidden)
        self.head = nn.Dense(hidden, CLASSES)

    def forward(self, x: object) -> object:
        return self.head(self.rnn(x)[0][:, -1])


class TorchNet(torch.nn.Module):
    """Net in torch.nn, the same names."""

    def __init__(self, kind: str, inputs: int, hidden: int):
        super().__init__()
        self.rnn = getattr(torch.nn, kind)(inputs, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


def contenders(kind: str, batch: int, steps: int, inputs: int, hidden: int) -> dict:
    """The three training steps, each returning its loss, from the same weights."""
    pb.manual_seed(0)
    model, twin = Net(kind, inputs, hidden), Net(kind, inputs, hidden)
    state = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    twin.load_state_dict(state)
    tmodel = TorchNet(kind, inputs, hidden)
    tmodel.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, steps, inputs)).astype(np.float32)
    y = rng.integers(0, CLASSES, batch)
    fns = {"pullback plan": plan_sgd_step(model, x, y, LR, MOMENTUM),
           "pullback eager": eager_sgd_step(twin, x, y, LR, MOMENTUM),
           "torch eager": torch_sgd_step(tmodel, None, x, y, LR, MOMENTUM)}
    if ALONE is not None:  # timing one contender in its own process: no other runs
        return fns
    losses = {name: [value(fn()) for _ in range(3)] for name, fn in fns.items()}
    for name in ("pullback plan", "pullback eager"):
        np.testing.assert_allclose(losses[name], losses["torch eager"], rtol=1e-4,
                                   err_msg=f"{kind} {name}")
    return fns


def gemm_floor(batch: int, steps: int, inputs: int, hidden: int) -> float:
    """Seconds of the LSTM step's matrix products alone, as pullback's CpuBackend runs
    them (NumPy's BLAS, the same shapes and order; the head's are negligible): the input
    projection, one recurrent product per step forward and one backward, the recurrent
    and input weights' gradients over all steps. What the step cannot go under while its
    products are BLAS calls; PyTorch runs the whole layer as oneDNN's fused RNN
    (aten::mkldnn_rnn_layer and its backward in its profiler), products included."""
    from common import best_time

    rng = np.random.default_rng(0)
    gates = 4 * hidden
    x = rng.standard_normal((steps * batch, inputs)).astype(np.float32)
    w_ih = rng.standard_normal((gates, inputs)).astype(np.float32)
    w_hh = rng.standard_normal((gates, hidden)).astype(np.float32)
    wt = np.ascontiguousarray(w_hh.T)
    h = rng.standard_normal((steps, batch, hidden)).astype(np.float32)
    da = rng.standard_normal((steps, batch, gates)).astype(np.float32)
    hw, carry = np.empty((batch, gates), np.float32), np.empty((batch, hidden), np.float32)

    def products() -> None:
        x @ w_ih.T
        for t in range(steps):
            np.matmul(h[t], wt, out=hw)
        for t in range(steps - 1, -1, -1):
            np.matmul(da[t], w_hh, out=carry)
        flat = da.reshape(steps * batch, gates)
        flat.T @ h.reshape(steps * batch, hidden)
        flat.T @ x

    return best_time(products, 5, 3)


def value(loss: object) -> float:
    return float(loss.detach() if isinstance(loss, torch.Tensor) else np.asarray(loss))


def main() -> int:
    torch.set_num_threads(THREADS)
    small = "--small" in sys.argv
    results = {}
    for case in SMALL if small else LARGE:
        kind, batch, steps, inputs, hidden = case
        label = f"{kind} N={batch} T={steps} input {inputs} hidden {hidden}"
        if not wanted(label):
            continue
        fns = contenders(*case)
        ways = both_ways(fns, repeats=5, number=20 if small else 3, case=label)
        unit, scale = ("us", 1e6) if small else ("ms", 1e3)
        results[label] = {f"{way} ({unit})": {name: round(t * scale, 1 if small else 2)
                                              for name, t in ts.items()}
                          for way, ts in ways.items()}
        results[label]["torch / pullback"] = {
            way: {name: round(ts["torch eager"] / ts[name], 2)
                  for name in ("pullback plan", "pullback eager")} for way, ts in ways.items()}
        if "--floor" in sys.argv and kind == "LSTM":
            results[label]["products alone, NumPy's BLAS (ms)"] = round(
                gemm_floor(batch, steps, inputs, hidden) * scale, 2)
        if "--profile" in sys.argv:
            profile(fns["pullback plan"], 50, 15, label)
    title = f"recurrent training step (SGD momentum, float32, {THREADS} threads)"
    print(json.dumps({"bench": title, "per step": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
