"""One training step of an MLP 64-256-256-10 on the digits, batch 128, SGD with momentum.

pullback (eager autograd, the explicit traced_forward/backprop/update path, and a
TRAINING plan from pb.compile)
against PyTorch and NumPy written by hand, in one run on the same data and
weights, every library on 2 threads. Run: `python bench/mlp_step.py`.
"""

from __future__ import annotations

import sys

from common import both_ways, pin_threads, plan_sgd_step, torch_sgd_step

pin_threads(2)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import pullback as pb  # noqa: E402
from pullback import nn, optim  # noqa: E402
from pullback.io import digits_split  # noqa: E402

BATCH, LR, MOMENTUM = 128, 0.05, 0.9


def make_pullback() -> nn.Module:
    pb.manual_seed(0)
    return nn.Sequential(nn.Dense(64, 256), nn.ReLU(), nn.Dense(256, 256), nn.ReLU(),
                         nn.Dense(256, 10))


def main() -> int:
    torch.set_num_threads(2)
    x_train, y_train, _, _ = digits_split()
    x = x_train[:BATCH].reshape(BATCH, 64)
    y = y_train[:BATCH]

    model = make_pullback()
    opt = optim.SGD(model.parameters(), LR, momentum=MOMENTUM)

    def pullback_step() -> None:
        opt.zero_grad()
        nn.cross_entropy(model(pb.tensor(x)), y).backward()
        opt.step()

    plan_step = plan_sgd_step(make_pullback(), x, y, LR, MOMENTUM)

    explicit = make_pullback()
    applyer = explicit.new_momentum(optim.TrainParams(LR), MOMENTUM)

    def explicit_step() -> None:
        logits, trace = explicit.traced_forward(pb.tensor(x))
        loss, vjp_fn = pb.vjp(lambda z: nn.cross_entropy(z, y), logits)
        (grad_logits,) = vjp_fn(pb.ones_like(loss))
        _, grads = explicit.backprop(trace, grad_logits)
        explicit.update(applyer, grads)

    tmodel = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                 torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                 torch.nn.Linear(256, 10))
    torch_step = torch_sgd_step(tmodel, model, x, y, LR, MOMENTUM)

    weights = [p.numpy().copy() for p in model.parameters()]
    buffers = [np.zeros_like(w) for w in weights]

    def numpy_step() -> None:
        w1, b1, w2, b2, w3, b3 = weights
        h1 = np.maximum(x @ w1.T + b1, 0)
        h2 = np.maximum(h1 @ w2.T + b2, 0)
        z = h2 @ w3.T + b3
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(BATCH), y] -= 1
        g3 = p / BATCH
        g2 = (g3 @ w3) * (h2 > 0)
        g1 = (g2 @ w2) * (h1 > 0)
        grads = [g1.T @ x, g1.sum(0), g2.T @ h1, g2.sum(0), g3.T @ h2, g3.sum(0)]
        for w, buf, g in zip(weights, buffers, grads):
            buf *= MOMENTUM
            buf += g
            w -= LR * buf

    ways = both_ways({
        "pullback": pullback_step,
        "pullback explicit": explicit_step,
        "pullback plan": plan_step,
        "pytorch": torch_step,
        "numpy by hand": numpy_step,
    }, repeats=9, number=200)
    print(f"training step, MLP 64-256-256-10 on digits, batch {BATCH}, SGD momentum, float32")
    print("  (best run of each; 'alone': each contender's runs back to back, 'turns': the")
    print("  contenders alternating run by run)")
    print(f"  {'':18s} {'alone':>8s} {'turns':>8s}  ms per step")
    for name in ways["alone"]:
        print(f"  {name:18s} {ways['alone'][name] * 1e3:8.3f} {ways['turns'][name] * 1e3:8.3f}")
    for a, b in (("pullback plan", "pytorch"), ("pullback", "pytorch"),
                 ("pullback", "numpy by hand")):
        print(f"  ratio {a} / {b}: " + ", ".join(
            f"{way} {times[a] / times[b]:.2f}" for way, times in ways.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
