"""Grad mode and the `use_backend` stack are per thread (as in PyTorch); `set_backend`
is process-wide. One thread's `no_grad` evaluation must not change what another
thread's training records."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

import pullback as pb
from pullback import nn, optim


def _in_thread(fn: Callable[[], Any]) -> Any:
    """fn's result (or exception, re-raised here) from a fresh thread."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as err:  # re-raised in the caller
            box["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    if "error" in box:
        raise box["error"]
    return box["result"]


class _Other(pb.CpuBackend):
    """A backend told apart from the default by its type."""


def test_no_grad_is_per_thread() -> None:
    inside, checked = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def evaluator() -> None:
        with pb.no_grad():
            inside.set()
            checked.wait(timeout=30)
            seen["evaluator"] = pb.is_grad_enabled()

    thread = threading.Thread(target=evaluator)
    thread.start()
    assert inside.wait(timeout=30)
    try:
        # The other thread is inside no_grad right now: this one still records.
        seen["main"] = pb.is_grad_enabled()
        x = pb.tensor([1.0, 2.0], requires_grad=True)
        y = (x * x).sum()
        seen["records"] = y.requires_grad
    finally:
        checked.set()
        thread.join(timeout=30)
    assert seen == {"main": True, "records": True, "evaluator": False}


def test_new_thread_starts_with_grad_enabled_and_the_process_backend() -> None:
    process_backend = pb.get_backend()
    with pb.no_grad(), pb.use_backend(_Other()):
        enabled, backend = _in_thread(lambda: (pb.is_grad_enabled(), pb.get_backend()))
    assert enabled is True
    assert backend is process_backend


def test_use_backend_in_one_thread_does_not_change_another_threads_backend() -> None:
    before = pb.get_backend()
    other = _Other()
    inside, checked = threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def user() -> None:
        with pb.use_backend(other):
            inside.set()
            checked.wait(timeout=30)
            seen["user"] = pb.get_backend()
        seen["user after"] = pb.get_backend()

    thread = threading.Thread(target=user)
    thread.start()
    assert inside.wait(timeout=30)
    try:
        seen["main"] = pb.get_backend()
    finally:
        checked.set()
        thread.join(timeout=30)
    assert seen["main"] is before
    assert seen["user"] is other
    assert seen["user after"] is before


def test_set_backend_is_process_wide() -> None:
    before = pb.get_backend()
    other = _Other()
    try:
        _in_thread(lambda: pb.set_backend(other))
        assert pb.get_backend() is other
    finally:
        pb.set_backend(before)
    assert pb.get_backend() is before


def test_grad_mode_survives_threads_entering_and_leaving_no_grad() -> None:
    # The interleaving that left grad mode off for the whole process when it was one
    # flag: this thread enters no_grad, the other enters, this one leaves (restoring
    # "on"), the other leaves (restoring the "off" it had saved).
    entered, left = threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def other() -> None:
        with pb.no_grad():
            entered.set()
            left.wait(timeout=30)
        seen["other after"] = pb.is_grad_enabled()

    thread = threading.Thread(target=other)
    with pb.no_grad():
        thread.start()
        assert entered.wait(timeout=30)
    left.set()
    thread.join(timeout=30)
    seen["main after"] = pb.is_grad_enabled()
    assert seen == {"other after": True, "main after": True}


def _mlp(seed: int) -> nn.Module:
    pb.manual_seed(seed)
    return nn.Sequential(nn.Dense(6, 16), nn.Tanh(), nn.Dense(16, 3))


def _train(model: nn.Module, steps: int, xs: np.ndarray, ys: np.ndarray) -> None:
    opt = optim.SGD(list(model.parameters()), lr=0.05)
    for i in range(steps):
        opt.zero_grad()
        loss = nn.mse_loss(model(pb.tensor(xs[i % len(xs)])), pb.tensor(ys[i % len(ys)]))
        loss.backward()
        opt.step()


def test_training_beside_no_grad_evaluation_matches_training_alone() -> None:
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((4, 8, 6)).astype(np.float32)
    ys = rng.standard_normal((4, 8, 3)).astype(np.float32)
    steps = 200
    alone = _mlp(0)
    _train(alone, steps, xs, ys)

    beside, evaluated = _mlp(0), _mlp(1)
    stop = threading.Event()
    evaluations: list[int] = [0]

    def evaluate() -> None:
        while not stop.is_set():
            with pb.no_grad():
                out = evaluated(pb.tensor(xs[0]))
            assert not out.requires_grad
            evaluations[0] += 1

    thread = threading.Thread(target=evaluate)
    thread.start()
    try:
        _train(beside, steps, xs, ys)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert evaluations[0] > 0
    for (name, a), b in zip(alone.named_parameters(), beside.parameters()):
        np.testing.assert_array_equal(b.numpy(), a.numpy(), err_msg=name)
