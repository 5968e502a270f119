"""Load PyTorch weights into the same model written with pullback.

pullback's layers take PyTorch's constructor arguments and name their parameters
and buffers as PyTorch does, so a PyTorch state dict, turned into NumPy arrays,
loads unchanged. The script builds a small CNN (Conv2d, BatchNorm2d, pooling,
Linear) in both libraries, trains the PyTorch one a few steps so its BatchNorm
running statistics move, copies the weights over, and compares the outputs in
eval mode. A pullback checkpoint file (`pb.save`) can hold the same weights.

Needs PyTorch (`pip install torch`) for the source weights; pullback itself
never imports it. Run: python examples/pytorch_weights.py
"""

from __future__ import annotations

import numpy as np
import torch

import pullback as pb
from pullback import nn


def torch_model() -> torch.nn.Module:
    t = torch.nn
    return t.Sequential(t.Conv2d(1, 4, 3, padding=1), t.BatchNorm2d(4), t.ReLU(),
                        t.AdaptiveAvgPool2d(1), t.Flatten(), t.Linear(4, 3))


def pullback_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))


def main() -> None:
    torch.manual_seed(0)
    source = torch_model()
    x = np.random.default_rng(0).normal(size=(8, 1, 6, 6)).astype(np.float32)
    opt = torch.optim.SGD(source.parameters(), lr=0.1)
    for _ in range(3):  # a few steps, so that BatchNorm's running statistics move
        opt.zero_grad()
        source(torch.from_numpy(x)).square().mean().backward()
        opt.step()
    source.eval()

    # Parameters and buffers (running_mean, running_var, num_batches_tracked), as NumPy.
    state = {name: value.detach().numpy() for name, value in source.state_dict().items()}
    print("keys:", ", ".join(state))
    model = pullback_model()
    model.load_state_dict(state)  # strict: every key must match, with its shape
    model.eval()

    with torch.no_grad():
        expected = source(torch.from_numpy(x)).numpy()
    got = model(pb.tensor(x)).numpy()
    difference = np.abs(got - expected).max()
    print(f"largest output difference from PyTorch: {difference:.1e}")
    assert difference < 1e-5


if __name__ == "__main__":
    main()
