"""Plans never bake silently: reading a traced value concretely while compiling raises
TracingError naming the operation and the user's line, and a plan traces again when
its inputs' shapes, a module's train/eval mode or a parameter's identity changed."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import nn

X = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.0

# Each function reads its traced argument concretely on its own (one) line.
REFUSED = [
    ("float(t)", lambda t: t / float(t.max())),
    ("int(t)", lambda t: t * int(t.sum())),
    ("bool(t)", lambda t: t if t.sum() > 0 else -t),
    ("t.item()", lambda t: t * t.max().item()),
    ("np.asarray(t)", lambda t: pb.tensor(np.asarray(t)) * 2),
    ("np.asarray(t)", lambda t: pb.tensor(np.array(t)) * 2),
    ("t.numpy()", lambda t: pb.tensor(t.numpy()) * 2),
    ("t.tolist()", lambda t: pb.tensor(t.tolist()) * 2),
    ("pb.tensor(t)", lambda t: pb.tensor(t) * 2),
]


@pytest.mark.parametrize("operation,fn", REFUSED, ids=[f"{i}-{op}" for i, (op, _) in
                                                       enumerate(REFUSED)])
def test_reading_a_traced_value_is_refused_naming_the_operation_and_line(operation, fn) -> None:
    with pytest.raises(pb.TracingError) as err:
        pb.compile(fn, X)
    message = str(err.value)
    assert message.startswith(operation)
    assert f"{__file__}:{fn.__code__.co_firstlineno}" in message
    assert "pb.where" in message and "input" in message


def test_values_computed_from_a_traced_value_and_parameters_are_refused_too() -> None:
    w = nn.Parameter(pb.tensor(np.ones(3, np.float32)))
    with pytest.raises(pb.TracingError, match="float"):
        pb.compile(lambda t: t * float(w.sum()), X)  # the plan reads w anew at each call
    with pytest.raises(pb.TracingError, match="bool"):
        pb.compile(lambda t: t if (t * 2 + 1).mean() > 0 else -t, X)


def test_constants_stay_readable_while_tracing() -> None:
    c = pb.tensor(np.array([1.0, 2.0, 3.0], np.float32))
    plan = pb.compile(lambda t: t * float(c.sum()) + np.asarray(c) * (c * 2).max().item(), X)
    np.testing.assert_allclose(plan(X).numpy(), X * 6.0 + np.array([1, 2, 3]) * 6.0)
    assert issubclass(pb.TracingError, RuntimeError)


def test_a_clone_of_a_traced_value_is_recorded_not_baked() -> None:
    plan = pb.compile(lambda t: t.clone() * 2, X)
    np.testing.assert_allclose(plan(X + 1).numpy(), (X + 1) * 2)


def test_eval_after_compiling_traces_again_and_drops_no_more() -> None:
    pb.manual_seed(0)
    model = nn.Sequential(nn.Dense(3, 4), nn.Dropout(0.5))
    x = np.ones((64, 3), np.float32)
    plan = pb.compile(model, x)
    assert (plan(x).numpy() == 0).any()  # dropout in training mode
    model.eval()
    np.testing.assert_allclose(plan(x).numpy(), model(pb.tensor(x)).numpy(), rtol=1e-6)
    assert plan.traces == 2
    model.train()
    assert (plan(x).numpy() == 0).any() and plan.traces == 2  # the first plan, kept


def _mse_grads(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple:
    """loss = mean((x @ w.T + b - y)^2) and its gradients, by hand in NumPy."""
    r = x @ w.T + b - y
    scale = 2.0 / r.size
    return (r ** 2).mean(), scale * r.T @ x, scale * r.sum(0)


def test_a_replaced_parameter_is_read_and_gets_its_gradient_in_a_training_plan() -> None:
    model = nn.Dense(3, 2)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 3), np.float32), rng.standard_normal((5, 2), np.float32)
    step = pb.compile(lambda a, b: nn.mse_loss(model(a), b), x, y,
                      mode=pb.LoweringMode.TRAINING)
    step(x, y)
    old = model.weight
    new_w = rng.standard_normal((2, 3), np.float32)
    model.weight = nn.Parameter(pb.tensor(new_w))
    model.bias.grad = None
    loss = step(x, y)
    want, dw, db = _mse_grads(new_w, model.bias.numpy(), x, y)
    np.testing.assert_allclose(loss.numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(model.weight.grad.numpy(), dw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.bias.grad.numpy(), db, rtol=1e-5, atol=1e-6)
    assert step.traces == 2 and old.grad is not None  # the old one kept only its first


@pytest.mark.parametrize("mode", [pb.LoweringMode.INFERENCE, pb.LoweringMode.TRAINING])
def test_a_last_partial_batch_traces_once_per_shape(mode) -> None:
    model = nn.Dense(3, 2)
    rng = np.random.default_rng(1)
    batches = {n: (rng.standard_normal((n, 3), np.float32),
                   rng.standard_normal((n, 2), np.float32)) for n in (32, 7)}
    fn = (lambda a, b: nn.mse_loss(model(a), b))
    plan = pb.compile(fn, *batches[32], mode=mode)
    for n, want_traces in ((32, 1), (7, 2), (32, 2), (7, 2)):
        x, y = batches[n]
        want = _mse_grads(model.weight.numpy(), model.bias.numpy(), x, y)
        model.weight.grad = None
        np.testing.assert_allclose(plan(x, y).numpy(), want[0], rtol=1e-5)
        if mode is pb.LoweringMode.TRAINING:
            np.testing.assert_allclose(model.weight.grad.numpy(), want[1], rtol=1e-5, atol=1e-6)
        assert plan.traces == want_traces
    assert "traced 2 time(s)" in plan.explain()


def test_the_plans_of_at_most_eight_shapes_are_kept() -> None:
    model = nn.Dense(3, 2)
    plan = pb.compile(model, np.zeros((1, 3), np.float32))
    for n in range(1, 11):
        x = np.full((n, 3), n, np.float32)
        np.testing.assert_allclose(plan(x).numpy(), model(pb.tensor(x)).numpy(), rtol=1e-6)
    assert plan.traces == 10
    plan(np.zeros((10, 3), np.float32))  # the most recent: kept
    assert plan.traces == 10
    plan(np.zeros((1, 3), np.float32))  # the least recently used: dropped, traced again
    assert plan.traces == 11


W = nn.Parameter(pb.tensor(np.ones(3, np.float32)))


def _scaled(t):
    return (t * W).sum()


def test_a_rebound_parameter_in_a_closure_or_the_globals_is_read_anew() -> None:
    global W
    w = nn.Parameter(pb.tensor(np.ones(3, np.float32)))
    closed = pb.compile(lambda t: (t * w).sum(), X, mode=pb.LoweringMode.TRAINING)
    named = pb.compile(_scaled, X, mode=pb.LoweringMode.TRAINING)
    w = nn.Parameter(pb.tensor(np.full(3, 2.0, np.float32)))
    old, W = W, nn.Parameter(pb.tensor(np.full(3, 3.0, np.float32)))
    try:
        np.testing.assert_allclose(closed(X).numpy(), X.sum() * 2.0)
        np.testing.assert_allclose(named(X).numpy(), X.sum() * 3.0)
        np.testing.assert_allclose(w.grad.numpy(), X.sum(0))
        np.testing.assert_allclose(W.grad.numpy(), X.sum(0))
        assert closed.traces == named.traces == 2
    finally:
        W = old
