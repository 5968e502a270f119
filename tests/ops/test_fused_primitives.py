"""cross_entropy and layer_norm run as the backend's fused kernels (FusedOps) on the CPU
backends and as compositions of forward ops elsewhere: both agree with PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pullback as pb
from pullback import ops
from pullback.backend import Backend, BackwardOps, CpuBackend, KernelError

# CpuBackend's forward ops, but neither its fused ops nor its backward kernels.
Plain = type("Plain", (BackwardOps, Backend), {
    name: vars(CpuBackend)[name] for name, value in vars(Backend).items()
    if callable(value) and not name.startswith("_")})

BACKENDS = {"cpu": CpuBackend(), "threaded": pb.ThreadedCpuBackend(2), "plain": Plain()}
TOL = {np.float32: {"rtol": 2e-5, "atol": 2e-6}, np.float64: {"rtol": 1e-11, "atol": 1e-12}}


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_and_its_gradient_match_torch(backend, dtype) -> None:
    logits = (_rng().standard_normal((6, 5)) * 3).astype(dtype)
    labels = _rng(1).integers(0, 5, 6)
    with pb.use_backend(BACKENDS[backend]):
        x = pb.tensor(logits, requires_grad=True)
        loss = pb.nn.cross_entropy(x, labels)
        loss.backward()
    t = torch.tensor(logits, requires_grad=True)
    want = F.cross_entropy(t, torch.tensor(labels))
    want.backward()
    assert loss.dtype == dtype
    np.testing.assert_allclose(loss.item(), want.item(), **TOL[dtype])
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), **TOL[dtype])


@pytest.mark.parametrize("backend", ["cpu", "threaded"])
def test_cross_entropy_labels_out_of_range_are_an_error(backend) -> None:
    with pb.use_backend(BACKENDS[backend]), pytest.raises(KernelError, match=r"\[0, 5\)"):
        ops.cross_entropy(pb.tensor(np.zeros((2, 5), np.float32)), np.array([0, 5]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_and_its_gradients_match_torch(backend, dtype) -> None:
    x, w, b = (_rng(i).standard_normal(s).astype(dtype) for i, s in
               enumerate([(2, 3, 8), (8,), (8,)]))
    upstream = _rng(5).standard_normal((2, 3, 8)).astype(dtype)
    with pb.use_backend(BACKENDS[backend]):
        xs = [pb.tensor(v, requires_grad=True) for v in (x, w, b)]
        y = pb.layer_norm(*xs, eps=1e-3)
        y.backward(pb.tensor(upstream))
    ts = [torch.tensor(v, requires_grad=True) for v in (x, w, b)]
    want = F.layer_norm(ts[0], (8,), ts[1], ts[2], eps=1e-3)
    want.backward(torch.tensor(upstream))
    np.testing.assert_allclose(y.numpy(), want.detach().numpy(), **TOL[dtype])
    for got, t in zip(xs, ts):
        np.testing.assert_allclose(got.grad.numpy(), t.grad.numpy(), **TOL[dtype])


def test_layer_norm_checks_its_operands() -> None:
    x = pb.tensor(np.zeros((2, 4), np.float32))
    with pytest.raises(KernelError, match=r"layer_norm: .*weight must have shape \(4,\)"):
        pb.layer_norm(x, pb.tensor(np.ones(3, np.float32)), pb.tensor(np.zeros(4, np.float32)))
    with pytest.raises(KernelError, match=r"layer_norm: .*bias must have shape \(4,\) and x's"):
        pb.layer_norm(x, pb.tensor(np.ones(4, np.float32)), pb.tensor(np.zeros(4)))


def test_nn_layer_norm_is_one_primitive_in_a_plan() -> None:
    model = pb.nn.LayerNorm(16)
    plan = pb.compile(model, np.zeros((4, 16), np.float32))
    assert [step.name for step in plan._schedule] == ["layer_norm"]
