"""Gradient buffers in training plans (lower/cotangents.py): the large cotangents go
into arrays kept across calls, and nothing a caller holds is ever overwritten."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import nn
from pullback.backend import Backend, BackwardOps, CpuBackend

TRAINING = pb.LoweringMode.TRAINING

NotCpu = type("NotCpu", (BackwardOps, Backend), {
    name: vars(CpuBackend)[name] for name, value in vars(Backend).items()
    if callable(value) and not name.startswith("_")})


def _data(shape: tuple, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])


class _AvgPool(nn.Module):
    def forward(self, x):
        return pb.avg_pool2d(x, 2)


def _cnn() -> nn.Module:
    pb.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), _AvgPool(),
                         nn.Flatten(), nn.Dense(16 * 4 * 4, 64), nn.ReLU(), nn.Dense(64, 10))


def _eager_grads(model: nn.Module, x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    for p in model.parameters():
        p.grad = None
    nn.cross_entropy(model(pb.tensor(x)), y).backward()
    return [p.grad.numpy().copy() for p in model.parameters()]


def _plan_grads(plan, model: nn.Module, x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    for p in model.parameters():
        p.grad = None
    plan(x, y)
    return [p.grad.numpy() for p in model.parameters()]


@pytest.mark.parametrize("backend", [None, pb.ThreadedCpuBackend(num_threads=2), NotCpu()],
                         ids=["cpu", "threaded", "other"])
def test_gradients_written_into_buffers_match_eager_call_after_call(backend) -> None:
    model = _cnn()
    x, y = _data((32, 3, 16, 16), 0)
    plan = pb.compile(lambda x, y: nn.cross_entropy(model(x), y), x, y, mode=TRAINING)
    # The pools', the second convolution's and the hidden dense layer's input gradients.
    assert len(plan._ct_buffers) >= 3
    assert "gradient buffers:" in plan.explain() and "into buffer g" in plan.explain()
    kept = None
    with pb.use_backend(backend or pb.CpuBackend()):
        for seed in (1, 2):  # the second call overwrites the first call's buffers
            x, y = _data((32, 3, 16, 16), seed)
            planned = _plan_grads(plan, model, x, y)
            for got, want in zip(planned, _eager_grads(model, x, y)):
                np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
            if kept is not None:  # what the first call left in .grad is untouched
                for before, copy in kept:
                    np.testing.assert_array_equal(before, copy)
            kept = [(g, g.copy()) for g in planned]


def test_a_cotangent_read_twice_is_summed_into_a_buffer() -> None:
    # h feeds two layers: its cotangent is the sum of two parts, the second added in
    # place into the buffer the first was written into.
    pb.manual_seed(0)
    first, left, right = nn.Dense(48, 96), nn.Dense(96, 10), nn.Dense(96, 10)

    def loss_fn(x, y):
        h = pb.relu(first(x))
        return nn.cross_entropy(left(h) + right(pb.tanh(h)), y)

    x, y = _data((256, 48), 3)
    plan = pb.compile(loss_fn, x, y, mode=TRAINING)
    (h,) = [eqn.out for eqn in plan.graph.eqns if eqn.primitive.name == "relu"]
    # A dense layer's product folded into its bias add writes the product's first
    # operand's gradient (backward_folds.py).
    into_h = [eqn.primitive.name for (eqn, *_), b in zip(plan._backward, plan._ct_owner)
              if b >= 0 and (plan._matmul_bias[eqn.out.index].product.args[0]
                             if eqn.out.index in plan._matmul_bias else eqn.args[0]) is h]
    assert into_h == ["add"]  # left's part in a buffer; tanh's is added into it
    params = [*first.parameters(), *left.parameters(), *right.parameters()]
    for seed in (4, 5):
        x, y = _data((256, 48), seed)
        for p in params:
            p.grad = None
        plan(x, y)
        planned = [p.grad.numpy().copy() for p in params]
        for p in params:
            p.grad = None
        loss_fn(pb.tensor(x), y).backward()
        for got, p in zip(planned, params):
            np.testing.assert_allclose(got, p.grad.numpy(), rtol=2e-4, atol=2e-6)


def test_a_parameter_gradient_that_views_a_buffer_is_copied_out() -> None:
    # A full-shape parameter added before a relu: add passes relu's buffered cotangent
    # straight through to it, and .grad must get its own copy.
    rng = np.random.default_rng(6)
    w = pb.tensor(rng.standard_normal((64, 128)).astype(np.float32) * 0.1,
                  requires_grad=True)
    shift = pb.tensor(rng.standard_normal((128, 128)).astype(np.float32), requires_grad=True)

    def loss_fn(x):
        return pb.sum(pb.tanh(pb.relu(x @ w + shift)))

    x = rng.standard_normal((128, 64)).astype(np.float32)
    plan = pb.compile(loss_fn, x, mode=TRAINING)
    assert [eqn.primitive.name for (eqn, *_), b in zip(plan._backward, plan._ct_owner)
            if b >= 0] == ["relu"]
    grads = []
    for seed in (7, 8):
        x = np.random.default_rng(seed).standard_normal((128, 64)).astype(np.float32)
        w.grad = shift.grad = None
        plan(x)
        assert not any(np.shares_memory(shift.grad.numpy(), b) for b in plan._ct_arena)
        grads.append((shift.grad.numpy(), shift.grad.numpy().copy(), w.grad.numpy().copy()))
        w.grad = shift.grad = None
        loss_fn(pb.tensor(x)).backward()
        np.testing.assert_allclose(grads[-1][1], shift.grad.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grads[-1][2], w.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(grads[0][0], grads[0][1])  # the first call's .grad kept


def test_a_dense_layer_input_gradient_is_laid_out_as_its_input() -> None:
    # Flattened maps (C-ordered) into Dense(512, 512): their (64, 512) gradient, which a
    # product would lay out by columns, comes C-ordered, so the reshape to the maps and
    # relu's backward read it contiguous; the hidden layer's (by columns) stays so.
    pb.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Flatten(), nn.Dense(512, 512),
                          nn.ReLU(), nn.Dense(512, 10))
    x, y = _data((64, 1, 6, 6), 9)
    plan = pb.compile(lambda x, y: nn.cross_entropy(model(x), y), x, y, mode=TRAINING)
    orders = [(eqn.primitive.name, plan._ct_buffers[b].order)
              for (eqn, *_), b in zip(plan._backward, plan._ct_owner) if b >= 0]
    # Backward order: the hidden layer's input gradient first, the maps' last; each
    # product's step folded into its bias add's, which writes the product's.
    assert orders == [("add", "F"), ("relu", "F"), ("add", "C"), ("relu", "C")]
    grads = _plan_grads(plan, model, x, y)
    for got, want in zip(grads, _eager_grads(model, x, y)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("frozen", [False, True], ids=["training", "eval"])
@pytest.mark.parametrize("backend", [None, pb.ThreadedCpuBackend(num_threads=2), NotCpu()],
                         ids=["cpu", "threaded", "other"])
def test_batch_norms_write_their_input_gradient_into_a_buffer(backend, frozen) -> None:
    """A batch norm's x gradient goes into a buffer (its kernel writes it there; in eval
    mode its rule's is copied in), call after call, as eager computes it."""
    pb.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8),
                          nn.Flatten(), nn.Dense(8 * 16 * 16, 10))
    if frozen:
        model[1].eval()
        model[4].eval()
    plan = pb.compile(lambda x, y: nn.cross_entropy(model(x), y), *_data((8, 3, 16, 16), 0),
                      mode=TRAINING)
    steps = [eqn.primitive.name for (eqn, *_), b in zip(plan._backward, plan._ct_owner)
             if b >= 0]
    assert steps.count("batch_norm") == 2
    for seed in (1, 2):  # the second call rewrites the buffers
        x, y = _data((8, 3, 16, 16), seed)
        with pb.use_backend(backend or pb.get_backend()):
            got = _plan_grads(plan, model, x, y)
        for g, want in zip(got, _eager_grads(model, x, y)):
            np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)
