"""Learning-rate schedules against torch.optim.lr_scheduler, and TrainParams.lr_at."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
from optim_oracle import (
    assert_histories_close,
    initial_values,
    pb_params,
    random_grads,
    run_pb,
    run_torch,
    torch_params,
)

from pullback import optim

STEPS = 25


def torch_factors(make_scheduler: Callable[[torch.optim.Optimizer], object],
                  steps: int = STEPS, lr: float = 1.0) -> list[float]:
    """The learning rate PyTorch's scheduler gives update 0, 1, ... (one step per update)."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    scheduler = make_scheduler(opt)
    factors = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "scheduler.step() before optimizer.step()"
        for _ in range(steps):
            factors.append(opt.param_groups[0]["lr"] / lr)
            scheduler.step()  # type: ignore[attr-defined]
    return factors


def ours(schedule: optim.Schedule, steps: int = STEPS) -> list[float]:
    return [schedule(step) for step in range(steps)]


def test_constant_is_one_everywhere() -> None:
    assert ours(optim.constant()) == [1.0] * STEPS


@pytest.mark.parametrize(("step_size", "gamma"), [(1, 0.5), (4, 0.1), (7, 0.9)])
def test_step_decay_matches_torch_steplr(step_size: int, gamma: float) -> None:
    expected = torch_factors(lambda o: torch.optim.lr_scheduler.StepLR(o, step_size, gamma))
    assert ours(optim.step_decay(step_size, gamma)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("total_steps", "min_factor"), [(10, 0.0), (24, 0.1), (7, 0.5)])
def test_cosine_matches_torch_cosine_annealing(total_steps: int, min_factor: float) -> None:
    # STEPS runs past total_steps in two cases: the factor follows torch's curve there too.
    lr = 0.3
    expected = torch_factors(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(
        o, T_max=total_steps, eta_min=min_factor * lr), lr=lr)
    got = ours(optim.cosine(total_steps, min_factor))
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-14)
    assert got[0] == 1.0 and got[total_steps] == pytest.approx(min_factor, abs=1e-15)


@pytest.mark.parametrize("warmup_steps", [1, 2, 5])
def test_linear_warmup_matches_torch_linearlr(warmup_steps: int) -> None:
    # LinearLR rising from 1/W to 1 over W - 1 scheduler steps gives (step + 1) / W.
    expected = torch_factors(lambda o: torch.optim.lr_scheduler.LinearLR(
        o, start_factor=1.0 / warmup_steps, end_factor=1.0, total_iters=warmup_steps - 1))
    got = ours(optim.linear_warmup(warmup_steps))
    assert got == pytest.approx(expected, rel=1e-12)
    assert got[:warmup_steps] == pytest.approx([(s + 1) / warmup_steps
                                                for s in range(warmup_steps)])


def test_linear_warmup_then_follows_the_next_schedule_shifted() -> None:
    warmup, inner = 4, optim.cosine(12, min_factor=0.2)
    got = ours(optim.linear_warmup(warmup, then=inner))
    assert got[:warmup] == [0.25, 0.5, 0.75, 1.0]
    assert got[warmup:] == [inner(step) for step in range(STEPS - warmup)]
    # The same as torch's SequentialLR of LinearLR then CosineAnnealingLR.
    expected = torch_factors(lambda o: torch.optim.lr_scheduler.SequentialLR(o, [
        torch.optim.lr_scheduler.LinearLR(o, start_factor=1 / warmup, end_factor=1.0,
                                          total_iters=warmup - 1),
        torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=12, eta_min=0.2),
    ], milestones=[warmup]))
    assert got == pytest.approx(expected, rel=1e-12)


def test_linear_warmup_of_zero_steps_is_the_next_schedule() -> None:
    assert ours(optim.linear_warmup(0, then=optim.step_decay(3))) == ours(optim.step_decay(3))
    assert ours(optim.linear_warmup(0)) == [1.0] * STEPS


def test_lr_at_multiplies_lr_by_the_factor() -> None:
    params = optim.TrainParams(0.5, schedule=optim.step_decay(2, gamma=0.5))
    assert [params.lr_at(s) for s in range(5)] == [0.5, 0.5, 0.25, 0.25, 0.125]
    assert optim.TrainParams(0.5).lr_at(1000) == 0.5
    assert optim.TrainParams(0.5, schedule=lambda step: 1.0 / (step + 1)).lr_at(3) == 0.125


def test_applyer_follows_its_schedule_as_torch_with_a_scheduler() -> None:
    values = initial_values(np.float64)
    grads = random_grads(values, steps=8)
    params = pb_params(values)
    opt = optim.SGD(params, optim.TrainParams(0.1, schedule=optim.step_decay(3, gamma=0.5)),
                    momentum=0.9)
    assert opt.lr == 0.1
    got = run_pb(opt, params, grads)
    assert opt.step_count == 8 and opt.lr == pytest.approx(0.1 * 0.5**2)
    tparams = torch_params(values)
    topt = torch.optim.SGD(tparams, lr=0.1, momentum=0.9)
    expected = run_torch(topt, tparams, grads,
                         scheduler=torch.optim.lr_scheduler.StepLR(topt, 3, gamma=0.5))
    assert_histories_close(got, expected)


def test_schedules_print_as_the_calls_that_built_them() -> None:
    assert repr(optim.constant()) == "constant()"
    assert repr(optim.step_decay(3)) == "step_decay(3, gamma=0.1)"
    assert repr(optim.cosine(100, min_factor=0.1)) == "cosine(100, min_factor=0.1)"
    assert repr(optim.linear_warmup(5, then=optim.cosine(10))) == \
        "linear_warmup(5, then=cosine(10, min_factor=0.0))"
    assert optim.cosine(10) == optim.cosine(10, 0.0)


@pytest.mark.parametrize(("make", "message"), [
    (lambda: optim.step_decay(0), "step_decay: step_size must be an integer >= 1"),
    (lambda: optim.step_decay(2.5), "step_decay: step_size must be an integer >= 1"),
    (lambda: optim.step_decay(2, gamma=-0.1), "step_decay: gamma must be a finite number >= 0"),
    (lambda: optim.cosine(0), "cosine: total_steps must be an integer >= 1"),
    (lambda: optim.cosine(10, min_factor=1.5), "cosine: min_factor must be a finite number"),
    (lambda: optim.linear_warmup(-1), "linear_warmup: warmup_steps must be an integer >= 0"),
    (lambda: optim.constant()(-1), "constant: the step must be an integer >= 0"),
    (lambda: optim.cosine(5)(1.5), "cosine: the step must be an integer >= 0"),
])
def test_schedule_rejects_bad_arguments(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_linear_warmup_rejects_a_then_that_is_not_a_schedule() -> None:
    with pytest.raises(TypeError, match="linear_warmup: then must be a schedule"):
        optim.linear_warmup(3, then=0.5)  # type: ignore[arg-type]


def test_lr_at_rejects_a_bad_factor_and_a_bad_step() -> None:
    with pytest.raises(ValueError, match=r"schedule .* gave factor -1.0 at step 0"):
        optim.TrainParams(0.1, schedule=lambda step: -1.0).lr_at(0)
    with pytest.raises(ValueError, match="gave factor nan"):
        optim.TrainParams(0.1, schedule=lambda step: math.nan).lr_at(0)
    with pytest.raises(ValueError, match=r"TrainParams\.lr_at: step must be an integer >= 0"):
        optim.TrainParams(0.1).lr_at(-1)
