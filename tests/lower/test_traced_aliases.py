"""The tracer tells a tensor from a detached alias of it (the same array, another tensor
without gradient), whichever of the two the function reads first."""

from __future__ import annotations

import numpy as np
import torch

import pullback as pb

TRAINING = pb.LoweringMode.TRAINING
X0 = np.array([1.5, 2.0])
Y0 = np.array([0.5, -1.0])
W0 = np.array([1.0, -2.0])


def _torch_grads(with_y: bool) -> tuple[np.ndarray, np.ndarray | None]:
    x = torch.tensor(X0, requires_grad=True)
    y = torch.tensor(Y0, requires_grad=True)
    w = torch.tensor(W0)
    inner = x.detach() * x + y if with_y else x.detach() * x
    torch.sum(inner * w).backward()
    return x.grad.numpy(), (y.grad.numpy() if with_y else None)


def _params() -> tuple[pb.Tensor, pb.Tensor, pb.Tensor]:
    return (pb.tensor(X0, dtype=pb.float64, requires_grad=True),
            pb.tensor(Y0, dtype=pb.float64, requires_grad=True),
            pb.tensor(W0, dtype=pb.float64))


def test_training_plan_reading_detach_before_the_parameter_keeps_its_gradient() -> None:
    x, y, w = _params()
    plan = pb.compile(lambda w: pb.sum((x.detach() * x + y) * w), w, mode=TRAINING)
    loss = plan(w)

    ex, ey, _ = _params()
    eager_loss = pb.sum((ex.detach() * ex + ey) * w)
    eager_loss.backward()
    torch_x, torch_y = _torch_grads(with_y=True)

    assert x.grad is not None
    np.testing.assert_allclose(loss.numpy(), eager_loss.numpy(), rtol=1e-15)
    np.testing.assert_allclose(x.grad.numpy(), ex.grad.numpy(), rtol=1e-15)
    np.testing.assert_allclose(x.grad.numpy(), torch_x, rtol=1e-15)
    np.testing.assert_allclose(y.grad.numpy(), torch_y, rtol=1e-15)


def test_training_plan_whose_only_parameter_is_read_detached_first() -> None:
    x, _, w = _params()
    plan = pb.compile(lambda w: pb.sum(x.detach() * x * w), w, mode=TRAINING)
    plan(w)
    torch_x, _ = _torch_grads(with_y=False)
    np.testing.assert_allclose(x.grad.numpy(), torch_x, rtol=1e-15)


def test_detached_parameter_read_first_follows_updates_of_the_parameter() -> None:
    # The alias reads the parameter at each call; it is not a constant baked at tracing.
    x, y, w = _params()
    plan = pb.compile(lambda w: pb.sum((x.detach() * x + y) * w), w, mode=TRAINING)
    plan(w)
    with pb.no_grad():
        x -= 1.0
    x.grad = None
    loss = plan(w)
    ex = pb.tensor(X0 - 1.0, dtype=pb.float64, requires_grad=True)
    eager_loss = pb.sum((ex.detach() * ex + pb.tensor(Y0)) * w)
    eager_loss.backward()
    np.testing.assert_allclose(loss.numpy(), eager_loss.numpy(), rtol=1e-15)
    np.testing.assert_allclose(x.grad.numpy(), ex.grad.numpy(), rtol=1e-15)


def test_detach_after_the_parameter_still_cuts_the_gradient() -> None:
    x, y, w = _params()
    plan = pb.compile(lambda w: pb.sum((x * x.detach() + y) * w), w, mode=TRAINING)
    plan(w)
    torch_x, _ = _torch_grads(with_y=True)
    np.testing.assert_allclose(x.grad.numpy(), torch_x, rtol=1e-15)
