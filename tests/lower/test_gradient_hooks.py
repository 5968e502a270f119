"""Gradient-ready hooks: a TRAINING plan and eager backward call them as each
parameter's gradient becomes final, during the backward (later layers first), with
`.grad` already set."""

from __future__ import annotations

import numpy as np

import pullback as pb
from pullback import nn
from pullback.lower import on_gradient_ready


def test_a_training_plan_calls_gradient_hooks_as_each_gradient_is_final() -> None:
    pb.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    names = {id(p): n for n, p in model.named_parameters()}
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.ones((2, 2), np.float32)
    step = pb.compile(lambda x, y: nn.mse_loss(model(x), y), x, y,
                      mode=pb.LoweringMode.TRAINING)
    seen: list[tuple[str, np.ndarray, int]] = []

    def hook(p: pb.Tensor) -> None:
        # How many parameters still lack a gradient: > 0 while the backward still runs.
        pending = sum(q.grad is None for q in model.parameters())
        seen.append((names[id(p)], p.grad.numpy().copy(), pending))

    handle = on_gradient_ready(hook)
    try:
        step(x, y)
    finally:
        handle.remove()
    order = [name for name, _, _ in seen]
    assert sorted(order) == sorted(names.values())
    # The last layer's gradients are final before the first layer's are computed.
    assert max(order.index("1.weight"), order.index("1.bias")) < \
        min(order.index("0.weight"), order.index("0.bias"))
    assert seen[0][2] == len(names) - 1
    # Each hook saw the gradient the plan leaves, and eager backward computes.
    eager = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    model.zero_grad()
    nn.mse_loss(model(pb.tensor(x)), y).backward()
    for name, grad, _ in seen:
        np.testing.assert_array_equal(grad, eager[name])
        np.testing.assert_allclose(grad, dict(model.named_parameters())[name].grad.numpy(),
                                   rtol=1e-6, atol=1e-7)
    step(x, y)  # removed: not called again
    assert len(seen) == len(names)


def test_eager_backward_calls_gradient_hooks_as_each_gradient_is_final() -> None:
    pb.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    names = {id(p): n for n, p in model.named_parameters()}
    x = pb.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    y = np.ones((2, 2), np.float32)
    nn.mse_loss(model(x), y).backward()  # no hook: the gradients all at the end
    expected = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    model.zero_grad()
    seen: list[tuple[str, np.ndarray, int]] = []

    def hook(p: pb.Tensor) -> None:
        pending = sum(q.grad is None for q in model.parameters())
        seen.append((names.get(id(p), "input"), p.grad.numpy().copy(), pending))

    handle = on_gradient_ready(hook)
    try:
        nn.mse_loss(model(x), y).backward()
        order = [name for name, _, _ in seen]
        assert sorted(order) == sorted([*names.values(), "input"])  # every leaf, once
        assert max(order.index("2.weight"), order.index("2.bias")) < \
            min(order.index("0.weight"), order.index("0.bias"))
        assert seen[0][2] == len(names) - 1  # the first call came mid-backward
        for name, grad, _ in seen:
            if name != "input":
                np.testing.assert_array_equal(grad, expected[name])
        # A recorded backward (create_graph) calls no hook: its gradients are graphs.
        count = len(seen)
        model.zero_grad()
        nn.mse_loss(model(x), y).backward(create_graph=True)
        assert len(seen) == count
    finally:
        handle.remove()
