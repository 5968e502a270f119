"""pb.compile: plans agree with eager execution, in both modes, for every layer."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import nn
from pullback.lower import LoweringError, epilogue

TRAINING = pb.LoweringMode.TRAINING

MODELS = {
    "dense": (lambda: nn.Dense(6, 4), (5, 6)),
    "mlp": (lambda: nn.Sequential(nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 4)), (5, 6)),
    "conv": (lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                   nn.Flatten(), nn.Dense(12, 4)), (5, 2, 4, 4)),
    "glu_layernorm": (lambda: nn.Sequential(nn.GLU(6, 5), nn.LayerNorm(5), nn.GELU(),
                                            nn.Dense(5, 4)), (5, 6)),
    "residual_lr": (lambda: nn.Sequential(nn.Residual(nn.Sequential(nn.Dense(6, 6), nn.Tanh())),
                                          nn.LR(nn.Dense(6, 4), 0.5), nn.Sigmoid()), (5, 6)),
    "bias1d": (lambda: nn.Sequential(nn.Bias1d(6), nn.Dense(6, 4)), (5, 6)),
}


def _data(shape: tuple, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", MODELS)
def test_inference_plan_matches_eager(name: str) -> None:
    make, shape = MODELS[name]
    pb.manual_seed(0)
    model = make()
    plan = pb.compile(model, _data(shape))
    x = _data(shape, seed=1)  # new data of the same shape
    np.testing.assert_allclose(plan(x).numpy(), model(pb.tensor(x)).numpy(), rtol=1e-6,
                               atol=1e-7)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("name", MODELS)
def test_training_plan_matches_eager_loss_and_gradients(name: str) -> None:
    make, shape = MODELS[name]
    pb.manual_seed(0)
    model = make()
    labels = np.arange(shape[0]) % 4

    def loss_fn(x, y):
        return nn.cross_entropy(model(x), y)

    step = pb.compile(loss_fn, _data(shape), labels, mode=TRAINING)
    x, y = _data(shape, seed=2), (labels + 1) % 4
    loss = step(x, y)
    planned = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = None
    eager = loss_fn(pb.tensor(x), y)
    eager.backward()
    np.testing.assert_allclose(loss.item(), eager.item(), rtol=1e-6)
    for n, p in model.named_parameters():
        np.testing.assert_allclose(planned[n], p.grad.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=n)


def test_training_plan_accumulates_like_backward_and_works_with_an_optimizer() -> None:
    pb.manual_seed(0)
    model = nn.Dense(3, 2)
    x, y = _data((4, 3)), np.array([0, 1, 1, 0])
    step = pb.compile(lambda x, y: nn.cross_entropy(model(x), y), x, y, mode=TRAINING)
    step(x, y)
    once = model.weight.grad.numpy().copy()
    step(x, y)
    np.testing.assert_allclose(model.weight.grad.numpy(), 2 * once, rtol=1e-6)
    opt = pb.optim.SGD(model.parameters(), 0.5)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        losses.append(step(x, y).item())
        opt.step()
    assert losses[-1] < 0.5 * losses[0]  # the plan reads the updated parameters each call


def test_dropout_in_a_training_plan_draws_a_fresh_mask_each_call() -> None:
    pb.manual_seed(0)
    drop = nn.Dropout(0.5, seed=1)
    plan = pb.compile(lambda x: drop(x), np.ones((50, 50), np.float32))
    a, b = plan(np.ones((50, 50), np.float32)).numpy(), plan(np.ones((50, 50), np.float32)).numpy()
    assert (a != b).any() and set(np.unique(a)) == {0.0, 2.0}


def test_a_plan_traces_other_shapes_again_and_refuses_mixed_dtypes_as_eager_does() -> None:
    model = nn.Dense(3, 2)
    plan = pb.compile(model, np.zeros((4, 3), np.float32))
    assert plan(np.zeros((5, 3), np.float32)).shape == (5, 2) and plan.traces == 2
    with pytest.raises(pb.KernelError, match="float64"):
        plan(np.zeros((4, 3), np.float64))


def test_lowering_refuses_an_op_without_backward_between_parameter_and_loss() -> None:
    class Sort(pb.CustomOp):
        def forward(self, x):
            return np.sort(x, axis=-1)

    model = nn.Dense(3, 2)
    with pytest.raises(LoweringError, match=r"Sort has no derivative rule.*weight \(2, 3\)"):
        pb.compile(lambda x: Sort()(model(x)).sum(), np.zeros((4, 3), np.float32),
                   mode=TRAINING)


def test_lowering_reports_parameters_that_get_no_gradient() -> None:
    used, unused = nn.Dense(3, 2), nn.Dense(3, 2)
    # `unused` is computed, but the loss sees it only through detach()
    with pytest.raises(LoweringError, match=r"no gradient.*weight \(2, 3\)"):
        pb.compile(lambda x: used(x).sum() + unused(x).detach().sum(),
                   np.zeros((4, 3), np.float32), mode=TRAINING)


def test_a_training_plan_needs_a_scalar_loss() -> None:
    model = nn.Dense(3, 2)
    with pytest.raises(LoweringError, match="one floating scalar loss"):
        pb.compile(model, np.zeros((4, 3), np.float32), mode=TRAINING)


def test_explain_lists_steps_saved_activations_and_peak_memory() -> None:
    model = nn.Sequential(nn.Dense(3, 8), nn.ReLU(), nn.Dense(8, 2))
    x, y = np.zeros((4, 3), np.float32), np.zeros(4, np.int64)
    text = pb.compile(lambda x, y: nn.cross_entropy(model(x), y), x, y, mode=TRAINING).explain()
    assert "plan (training)" in text and "matmul" in text and "relu" in text
    assert "saved activations:" in text and "peak memory" in text
    infer = pb.compile(model, x).explain()
    assert "plan (inference)" in infer and "backward" not in infer


@pytest.mark.parametrize("epilogues", [False, True])
def test_an_inference_plan_keeps_no_activations(epilogues, monkeypatch) -> None:
    monkeypatch.setattr(epilogue, "MIN_PRODUCT", 0 if epilogues else epilogue.MIN_PRODUCT)
    model = nn.Sequential(nn.Dense(3, 8), nn.ReLU(), nn.Dense(8, 2))
    plan = pb.compile(model, np.zeros((4, 3), np.float32))
    # every intermediate value a step makes is dropped right after its last use (a
    # dense layer's product, its bias and relu are one step: no values between them)
    freed = {s for step in plan._frees for s in step}
    made = {step.out.index for step in plan._schedule}
    values = {v.index for v in plan.graph.vars if v.kind == "value" and v.index in made} - \
        {v.index for v in plan.graph.outputs}
    assert values == freed
    assert ("2 matrix products with their bias" in plan.explain()) == epilogues


def test_detach_inside_a_traced_function_follows_new_inputs_without_gradient() -> None:
    pb.manual_seed(0)
    model = nn.Dense(3, 1)

    def loss_fn(x):
        y = model(x)
        return (y * y.detach()).sum()  # d/dw = x^T y: the detached factor is a constant

    x0 = _data((4, 3))
    step = pb.compile(loss_fn, x0, mode=TRAINING)
    x = _data((4, 3), seed=5)
    loss = step(x)
    planned = model.weight.grad.numpy().copy()
    model.weight.grad = model.bias.grad = None
    eager = loss_fn(pb.tensor(x))
    eager.backward()
    np.testing.assert_allclose(loss.item(), eager.item(), rtol=1e-6)
    np.testing.assert_allclose(planned, model.weight.grad.numpy(), rtol=1e-5)


def test_a_training_plan_returns_auxiliary_outputs_after_the_loss() -> None:
    model = nn.Dense(3, 2)
    x, y = _data((4, 3)), np.array([0, 1, 1, 0])

    def loss_and_logits(x, y):
        logits = model(x)
        return nn.cross_entropy(logits, y), logits

    loss, logits = pb.compile(loss_and_logits, x, y, mode=TRAINING)(x, y)
    np.testing.assert_allclose(logits.numpy(), model(pb.tensor(x)).numpy(), rtol=1e-6)
    assert loss.shape == () and model.weight.grad is not None


def test_gradients_taken_over_from_the_plan_never_share_a_buffer() -> None:
    # add's transpose hands the same cotangent to both operands: one parameter may take
    # it over, the other must get its own copy.
    w1 = pb.tensor(np.ones((64, 128)), requires_grad=True)
    w2 = pb.tensor(np.ones((64, 128)), requires_grad=True)
    x = np.random.default_rng(0).standard_normal((64, 128))
    plan = pb.compile(lambda x: pb.sum((w1 + w2) * x), x, mode=TRAINING)
    plan(x)
    g1, g2 = w1.grad.numpy(), w2.grad.numpy()
    np.testing.assert_array_equal(g1, x)
    np.testing.assert_array_equal(g2, x)
    assert not np.shares_memory(g1, g2)
    assert not np.shares_memory(g1, x) and not np.shares_memory(g2, x)
