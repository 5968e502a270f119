"""pullback.gpt's GPT trained with AdamW against its PyTorch twin, from the same weights
on the same batches: the loss of every step agrees, through eager autograd and
through a TRAINING plan (bench/gpt_step.py times the same at full size)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gpt_twin import twin_of

import pullback as pb
from pullback import optim
from pullback.gpt import GPT, _loss

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS, BATCH, STEPS = 11, 8, 16, 2, 2, 4, 10
ADAMW = {"lr": 1e-2, "betas": (0.9, 0.98), "eps": 1e-8, "weight_decay": 0.1}


def _torch_losses(weights: dict, windows: list[np.ndarray]) -> list[float]:
    twin = twin_of(weights, VOCAB, CONTEXT, WIDTH, HEADS, LAYERS)
    opt = torch.optim.AdamW(twin.parameters(), **ADAMW)
    losses = []
    for w in windows:
        w = torch.from_numpy(w)
        opt.zero_grad()
        logits = twin(w[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), w[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def start() -> tuple[dict, list[np.ndarray], list[float]]:
    pb.manual_seed(3)
    weights = {k: v.numpy().copy()
               for k, v in GPT(VOCAB, CONTEXT, WIDTH, HEADS, LAYERS).state_dict().items()}
    rng = np.random.default_rng(0)
    windows = [rng.integers(0, VOCAB, (BATCH, CONTEXT + 1)) for _ in range(STEPS)]
    # One thread: PyTorch's pool costs ms per tiny op on a busy machine (6 s here).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return weights, windows, _torch_losses(weights, windows)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("planned", [False, True], ids=["eager", "plan"])
def test_adamw_steps_match_pytorch_loss_for_loss(start, planned: bool) -> None:
    weights, windows, expected = start
    model = GPT(VOCAB, CONTEXT, WIDTH, HEADS, LAYERS)
    assert set(model.state_dict()) == set(weights)  # the twin's names, unchanged
    model.load_state_dict({k: pb.tensor(v.copy()) for k, v in weights.items()})
    opt = optim.AdamW(model.parameters(), **ADAMW)
    plan = pb.compile(lambda x, y: _loss(model, x, y), windows[0][:, :-1], windows[0][:, 1:],
                      mode=pb.LoweringMode.TRAINING) if planned else None
    losses = []
    for w in windows:
        opt.zero_grad()
        if planned:
            loss = plan(w[:, :-1], w[:, 1:])
        else:
            loss = _loss(model, pb.tensor(w[:, :-1]), w[:, 1:])
            loss.backward()
        opt.step()
        losses.append(loss.item())
    assert expected[-1] < expected[0] - 0.1  # the steps train: a test that can fail
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
