"""pb.compile from several threads: each thread's tracer sees only that thread's ops, and
concurrent compiles of different models' training plans agree with eager."""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np

import pullback as pb
from pullback import nn
from pullback.lower.graph import trace

TRAINING = pb.LoweringMode.TRAINING


def test_tracing_in_one_thread_does_not_capture_another_threads_ops() -> None:
    inside, done = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    def traced(x: pb.Tensor) -> pb.Tensor:
        y = pb.tanh(x)
        inside.set()
        done.wait(timeout=30)  # the other thread computes while this one traces
        return y * 2.0

    def tracer_thread() -> None:
        box["graph"], _ = trace(traced, (np.ones(3, np.float32),))

    thread = threading.Thread(target=tracer_thread)
    thread.start()
    assert inside.wait(timeout=30)
    try:
        w = pb.tensor([1.0, 2.0, 3.0], requires_grad=True)
        loss = pb.sum(pb.exp(w) * w)
        loss.backward()
    finally:
        done.set()
        thread.join(timeout=30)
    # This thread's ops ran eagerly and recorded; the tracer saw only its own two.
    np.testing.assert_allclose(w.grad.numpy(), np.exp([1.0, 2.0, 3.0]) * (1 + np.array(
        [1.0, 2.0, 3.0])), rtol=1e-6)
    assert [e.primitive.name for e in box["graph"].eqns] == ["tanh", "mul"]
    assert box["graph"].params == []


def _model(seed: int, activation: type) -> nn.Module:
    pb.manual_seed(seed)
    return nn.Sequential(nn.Dense(6, 8), activation(), nn.Dense(8, 8), activation(),
                         nn.Dense(8, 3))


def _eager(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, list[np.ndarray]]:
    loss = nn.mse_loss(model(pb.tensor(x)), pb.tensor(y))
    loss.backward()
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return float(loss.item()), grads


def concurrent_training_steps(models: list[nn.Module], x: np.ndarray,
                              y: np.ndarray) -> list[Any]:
    """Per model, from one thread each, started together: compile its training plan and
    run one step; (loss, gradients) or the exception raised."""
    start = threading.Barrier(len(models))
    results: list[Any] = [None] * len(models)

    def compile_and_step(i: int) -> None:
        model = models[i]
        try:
            start.wait(timeout=30)
            step = pb.compile(lambda a, b: nn.mse_loss(model(a), b), x, y, mode=TRAINING)
            loss = step(x, y)
            results[i] = (float(loss.item()), [p.grad.numpy().copy() for p in model.parameters()])
        except Exception as err:  # reported by the caller, in its thread
            results[i] = err

    threads = [threading.Thread(target=compile_and_step, args=(i,)) for i in range(len(models))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_concurrent_training_compiles_of_two_models_match_eager() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    y = rng.standard_normal((5, 3)).astype(np.float32)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, in the middle of tracing
    try:
        for trial in range(8):
            models = [_model(trial, nn.Tanh), _model(trial + 100, nn.Sigmoid)]
            expected = [_eager(m, x, y) for m in models]
            results = concurrent_training_steps(models, x, y)
            for (loss, grads), got in zip(expected, results):
                assert not isinstance(got, Exception), f"trial {trial}: {got!r}"
                np.testing.assert_allclose(got[0], loss, rtol=1e-5)
                for g, e in zip(got[1], grads):
                    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)
    finally:
        sys.setswitchinterval(interval)
    assert pb.is_grad_enabled()
