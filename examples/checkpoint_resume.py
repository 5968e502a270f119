"""Checkpoint a training run and resume it exactly.

`pullback.io.save_training` writes the model's and the optimizer's state, the
step, the data generator's state and your own extras to one safetensors file
(atomically, with checksums; no pickle). `load_training` restores them. The
script trains a small MLP for `--steps` steps without stopping, then again with
a stop and a resume halfway through (from a fresh model and optimizer, as after a
crash), and checks that both runs end with identical weights. `pb.save` and
`pb.load` write and read plain state dicts (the final weights).

Run: python examples/checkpoint_resume.py [--steps N]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import pullback as pb
from pullback import io, nn, optim

X = np.random.default_rng(0).normal(size=(64, 6)).astype(np.float32)
Y = (X.sum(1) > 0).astype(np.int64)


def fresh() -> tuple[nn.Module, optim.Adam]:
    pb.manual_seed(0)  # the same initial weights every time
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    return model, optim.Adam(model.parameters(), lr=0.01)


def train(model: nn.Module, opt: optim.Adam, rng: np.random.Generator, start: int,
          stop: int) -> None:
    """Steps start..stop-1, each on a batch of 8 drawn from `rng`."""
    for _ in range(start, stop):
        batch = rng.choice(len(X), 8, replace=False)
        opt.zero_grad()
        nn.cross_entropy(model(pb.tensor(X[batch])), Y[batch]).backward()
        opt.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    steps = parser.parse_args().steps
    half = steps // 2

    model, opt = fresh()
    train(model, opt, np.random.default_rng(1), 0, steps)
    uninterrupted = {k: v.numpy().copy() for k, v in model.state_dict().items()}

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "run.safetensors")
        model, opt = fresh()
        rng = np.random.default_rng(1)
        train(model, opt, rng, 0, half)
        io.save_training(path, model=model, optimizer=opt, step=half, rng=rng,
                         extra={"note": "stopped halfway"})
        print(f"saved a checkpoint at step {half}")
        del model, opt, rng  # as if the process had died

        model, opt = fresh()
        state = io.load_training(path, model=model, optimizer=opt)
        print(f"resumed at step {state['step']} ({state['extra']['note']})")
        assert state["rng"] is not None  # saved above; a checkpoint may go without one
        train(model, opt, state["rng"], state["step"], steps)

        weights = os.path.join(folder, "final.safetensors")
        pb.save(model.state_dict(), weights)
        reloaded = pb.load(weights)

    same = all(np.array_equal(uninterrupted[k], reloaded[k].numpy()) for k in uninterrupted)
    print("resumed run equals the uninterrupted run:", same)
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
