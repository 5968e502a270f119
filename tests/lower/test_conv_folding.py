"""Inference plans fold eval-mode batch norms into the convolution before them and run
each convolution with its bias, residual and relu as one step: equal to the ops one by
one (eager) and to PyTorch, in float32 and float64; parameters changed after compiling
are seen; training plans fold nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback import nn
from pullback.backend import Backend, BackwardOps, CpuBackend

TOL = {np.float32: {"rtol": 1e-5, "atol": 1e-5}, np.float64: {"rtol": 1e-12, "atol": 1e-12}}

# CpuBackend's forward ops on a backend that is not a CpuBackend: no plan kernels, so a
# convolution's epilogue runs through FusedOps' defaults, op by op.
NotCpu = type("NotCpu", (BackwardOps, Backend), {
    name: vars(CpuBackend)[name] for name, value in vars(Backend).items()
    if callable(value) and not name.startswith("_")})


class Block(nn.Module):
    """conv-BN-relu, then conv (with bias)-BN plus a 1x1 conv-BN shortcut, relu."""

    def __init__(self, dtype: np.dtype):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(4)
        self.short = nn.Conv2d(3, 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(4)
        self.to(dtype)

    def forward(self, x):
        y = pb.relu(self.bn1(self.conv1(x)))
        return pb.relu(self.bn2(self.conv2(y)) + self.bn3(self.short(x)))


def _torch_block(dtype: np.dtype) -> torch.nn.Module:
    t = torch.nn.Module()
    t.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
    t.bn1 = torch.nn.BatchNorm2d(4)
    t.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1)
    t.bn2 = torch.nn.BatchNorm2d(4)
    t.short = torch.nn.Conv2d(3, 4, 1, bias=False)
    t.bn3 = torch.nn.BatchNorm2d(4)
    return t.to(torch.float64 if dtype == np.float64 else torch.float32)


def _block(dtype: np.dtype, seed: int = 0) -> tuple[Block, torch.nn.Module]:
    """A block in eval mode with random statistics and affine, and its torch twin."""
    rng = np.random.default_rng(seed)
    model, twin = Block(dtype), _torch_block(dtype)
    for bn in (model.bn1, model.bn2, model.bn3):
        bn.running_mean.numpy()[:] = rng.standard_normal(4)
        bn.running_var.numpy()[:] = rng.random(4) + 0.5
        bn.weight.numpy()[:] = rng.standard_normal(4)
        bn.bias.numpy()[:] = rng.standard_normal(4)
    twin.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                          for k, v in model.state_dict().items()})
    return model.eval(), twin.eval()


def _torch_forward(twin: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        t = torch.from_numpy(x)
        y = torch.relu(twin.bn1(twin.conv1(t)))
        return torch.relu(twin.bn2(twin.conv2(y)) + twin.bn3(twin.short(t))).numpy()


def _eager(model: nn.Module, x: np.ndarray) -> np.ndarray:
    with pb.no_grad():
        return model(pb.tensor(x)).numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_folded_plan_matches_eager_and_torch(dtype):
    model, twin = _block(dtype)
    x = np.random.default_rng(1).standard_normal((2, 3, 5, 5)).astype(dtype)
    plan = pb.compile(model, x)
    got = plan(x).numpy()
    # Bit for bit: each batch norm's scale and shift are computed as the op computes them,
    # and the epilogue applies them in the ops' order.
    np.testing.assert_array_equal(got, _eager(model, x))
    np.testing.assert_allclose(got, _torch_forward(twin, x), **TOL[dtype])
    steps = [step.name for step in plan._schedule]
    assert "batch_norm" not in steps
    # Three convolutions, each with its batch norm's scale and shift in its epilogue (the
    # weights are parameters: not scaled at each call); the last takes the shortcut's
    # result as its residual.
    assert steps.count("fused(conv2d, mul, add, relu)") == 1
    assert steps.count("fused(conv2d, mul, add)") == 1
    assert steps.count("fused(conv2d, add, mul, add, add, relu)") == 1  # conv2 has a bias
    text = plan.explain()
    assert text.count("folded: conv2d") == 3
    assert text.count("computed at every call (from parameters or buffers)") == 3
    assert "its epilogue applied to each chunk of its output in cache" in text


def test_changes_after_compiling_are_seen():
    """The folded scale and shift come from parameters and buffers: computed at every
    call, so an in-place update (an optimizer's, a new running mean) reaches the next."""
    model, twin = _block(np.float32)
    x = np.random.default_rng(2).standard_normal((2, 3, 5, 5)).astype(np.float32)
    plan = pb.compile(model, x)
    plan(x)
    model.conv1.weight.numpy()[:] *= 2.0
    model.bn2.weight.numpy()[:] += 1.0
    model.bn3.running_mean.numpy()[:] -= 0.5
    twin.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                          for k, v in model.state_dict().items()})
    np.testing.assert_allclose(plan(x).numpy(), _torch_forward(twin, x), **TOL[np.float32])


def test_epilogue_runs_through_another_backends_ops():
    model, _ = _block(np.float64)
    x = np.random.default_rng(3).standard_normal((2, 3, 5, 5))
    plan = pb.compile(model, x)
    with pb.use_backend(NotCpu()):
        got = plan(x).numpy()
    np.testing.assert_allclose(got, _eager(model, x), **TOL[np.float64])


def test_training_plan_does_not_fold():
    model, _ = _block(np.float32)
    model.train()
    x = np.random.default_rng(4).standard_normal((2, 3, 5, 5)).astype(np.float32)
    plan = pb.compile(lambda t: model(t).sum(), x, mode=pb.LoweringMode.TRAINING)
    before = model.bn1.running_mean.numpy().copy()
    plan(x)
    assert not plan._folds and "folded" not in plan.explain()
    # (Each batch norm a step of its own, or with the relu after it: never in a conv.)
    norms = [step for step in plan._schedule
             if any(e.primitive.name == "batch_norm" for e in step.eqns)]
    assert len(norms) == 3 and all(step.eqns[0].primitive.name == "batch_norm"
                                   for step in norms)
    # A convolution runs with its bias (an epilogue: no partial result is saved for
    # backward), never with a batch norm's affine map.
    epilogues = [[e.primitive.name for e in step.eqns] for step in plan._schedule
                 if step.epilogue]
    assert epilogues and all(names == ["conv2d", "add"] for names in epilogues)
    assert not np.allclose(model.bn1.running_mean.numpy(), before)  # the BN trained


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_training_plan_runs_a_convolution_its_bias_and_relu_as_one_step(dtype):
    # Backward reads neither the convolution's result nor the bias add's (relu keeps
    # its own output), so the forward never makes them; the gradients are eager's.
    pb.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1, dtype=dtype)
    head = nn.Dense(4 * 5 * 5, 2, dtype=dtype)

    def loss_fn(x):
        h = pb.relu(conv(x))
        return (head(pb.reshape(h, (x.shape[0], -1))) ** 2).sum()

    x = np.random.default_rng(5).standard_normal((3, 3, 5, 5)).astype(dtype)
    plan = pb.compile(loss_fn, x, mode=pb.LoweringMode.TRAINING)
    steps = [[e.primitive.name for e in step.eqns] for step in plan._schedule if step.epilogue]
    assert steps == [["conv2d", "add", "relu"]]
    got = plan(x).item()
    planned = [p.grad.numpy().copy() for p in (*conv.parameters(), *head.parameters())]
    for p in (*conv.parameters(), *head.parameters()):
        p.grad = None
    eager = loss_fn(pb.tensor(x))
    eager.backward()
    assert got == pytest.approx(eager.item(), rel=1e-6)
    for g, p in zip(planned, (*conv.parameters(), *head.parameters()), strict=True):
        np.testing.assert_allclose(g, p.grad.numpy(), **TOL[dtype])
