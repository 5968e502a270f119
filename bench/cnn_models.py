"""The CNNs the convolution benchmarks train, each with its PyTorch twin and input shape
(bench/cnn.py's three, bench/plans.py's two). Import after `common.pin_threads` (it
imports torch)."""

from __future__ import annotations

import torch

import pullback as pb
from pullback import nn


def digits() -> tuple:
    """Issue 15's digits CNN: convs 16 and 32 (3x3, no padding), batch 128."""
    pb.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.ReLU(),
                          nn.Flatten(), nn.Dense(32 * 4 * 4, 10))
    tmodel = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3), torch.nn.ReLU(),
                                 torch.nn.Conv2d(16, 32, 3), torch.nn.ReLU(),
                                 torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 10))
    return model, tmodel, (128, 1, 8, 8)


def train_cnn() -> tuple:
    """`pullback train`'s CNN (`build_model("cnn")`), batch 32, on random 1x8x8 images."""
    from pullback.training import build_model

    pb.manual_seed(0)
    tmodel = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(),
                                 torch.nn.MaxPool2d(2), torch.nn.Conv2d(32, 64, 3, padding=1),
                                 torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                 torch.nn.Linear(64 * 2 * 2, 10))
    return build_model("cnn"), tmodel, (32, 1, 8, 8)


def cifar_cnn() -> tuple:
    """A CNN on 3x32x32: convs 32 and 64 (3x3, padding 1) with max pools, batch 64."""
    pb.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Dense(64 * 8 * 8, 10))
    tmodel = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                                 torch.nn.MaxPool2d(2), torch.nn.Conv2d(32, 64, 3, padding=1),
                                 torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                 torch.nn.Linear(64 * 8 * 8, 10))
    return model, tmodel, (64, 3, 32, 32)
