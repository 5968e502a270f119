"""TrainParams' gradient treatments (clip_value, clip_norm, l2, l1) in every applyer,
against PyTorch doing the same by hand, and per-parameter learning-rate scales."""

from __future__ import annotations

import gc
import math
from typing import Any

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

import pullback as pb
from pullback import optim

DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])

APPLYERS: dict[str, tuple[Any, dict, Any, dict]] = {
    "sgd": (optim.SGD, {"momentum": 0.9}, torch.optim.SGD, {"momentum": 0.9}),
    "rmsprop": (optim.RMSProp, {"beta": 0.9}, torch.optim.RMSprop, {"alpha": 0.9}),
    "adam": (optim.Adam, {}, torch.optim.Adam, {}),
    "adamw": (optim.AdamW, {}, torch.optim.AdamW, {}),
}


def compare(name: str, train_params: optim.TrainParams, dtype: type, torch_treatment: Any,
            grad_scale: float = 1.0) -> None:
    """Our applyer with `train_params` against torch's, whose grads `torch_treatment`
    (given the torch params) changes in place before each step."""
    ours_cls, ours_kwargs, torch_cls, torch_kwargs = APPLYERS[name]
    values = initial_values(dtype)
    grads = random_grads(values, scale=grad_scale)
    params = pb_params(values)
    got = run_pb(ours_cls(params, train_params, **ours_kwargs), params, grads)
    tparams = torch_params(values)
    topt = torch_cls(tparams, lr=train_params.lr, **torch_kwargs)
    expected = run_torch(topt, tparams, grads, before_step=lambda: torch_treatment(tparams))
    assert_histories_close(got, expected)


@DTYPES
@pytest.mark.parametrize("name", list(APPLYERS))
@pytest.mark.parametrize("grad_scale", [0.1, 10.0], ids=["below", "above"])
def test_clip_norm_matches_torch_clip_grad_norm(name: str, dtype: type, grad_scale: float) -> None:
    compare(name, optim.TrainParams(0.01, clip_norm=2.0), dtype,
            lambda ps: torch.nn.utils.clip_grad_norm_(ps, max_norm=2.0), grad_scale)


@DTYPES
@pytest.mark.parametrize("name", list(APPLYERS))
def test_clip_value_matches_torch_clip_grad_value(name: str, dtype: type) -> None:
    compare(name, optim.TrainParams(0.01, clip_value=0.5), dtype,
            lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.5))


@DTYPES
def test_clip_value_comes_before_clip_norm(dtype: type) -> None:
    def treat(ps: list[torch.Tensor]) -> None:
        torch.nn.utils.clip_grad_value_(ps, 0.5)
        torch.nn.utils.clip_grad_norm_(ps, max_norm=1.0)

    compare("sgd", optim.TrainParams(0.05, clip_value=0.5, clip_norm=1.0), dtype, treat, 3.0)


@DTYPES
@pytest.mark.parametrize("name", list(APPLYERS))
def test_l2_adds_l2_times_param_to_the_gradient(name: str, dtype: type) -> None:
    def treat(ps: list[torch.Tensor]) -> None:
        for p in ps:
            p.grad.add_(p.detach(), alpha=0.1)

    compare(name, optim.TrainParams(0.01, l2=0.1), dtype, treat)


@DTYPES
@pytest.mark.parametrize("name", list(APPLYERS))
def test_l1_adds_l1_times_sign_of_param_to_the_gradient(name: str, dtype: type) -> None:
    def treat(ps: list[torch.Tensor]) -> None:
        for p in ps:
            p.grad.add_(torch.sign(p.detach()), alpha=0.05)

    compare(name, optim.TrainParams(0.01, l1=0.05), dtype, treat)


@DTYPES
def test_all_treatments_run_in_order_clip_value_clip_norm_l2_l1(dtype: type) -> None:
    def treat(ps: list[torch.Tensor]) -> None:
        torch.nn.utils.clip_grad_value_(ps, 0.8)
        torch.nn.utils.clip_grad_norm_(ps, max_norm=1.5)
        for p in ps:
            p.grad.add_(p.detach(), alpha=0.1)
            p.grad.add_(torch.sign(p.detach()), alpha=0.05)

    params = optim.TrainParams(0.01, l1=0.05, l2=0.1, clip_norm=1.5, clip_value=0.8)
    compare("adam", params, dtype, treat, grad_scale=2.0)


def test_sgd_l2_equals_torch_weight_decay() -> None:
    values = initial_values(np.float64)
    grads = random_grads(values)
    params = pb_params(values)
    got = run_pb(optim.SGD(params, optim.TrainParams(0.05, l2=0.2)), params, grads)
    tparams = torch_params(values)
    expected = run_torch(torch.optim.SGD(tparams, lr=0.05, weight_decay=0.2), tparams, grads)
    assert_histories_close(got, expected)


def test_treatments_do_not_change_the_gradients() -> None:
    params = pb_params(initial_values(np.float32))
    grads = random_grads(initial_values(np.float32), steps=1, scale=5.0)[0]
    opt = optim.SGD(params, optim.TrainParams(0.1, l1=0.1, l2=0.1, clip_norm=0.5, clip_value=1.0),
                    weight_decay=0.1)
    for p, g in zip(params, grads):
        p.grad = pb.tensor(g.copy())
    opt.step()
    for p, g in zip(params, grads):
        np.testing.assert_array_equal(p.grad.numpy(), g)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lr": -0.1}, "TrainParams: lr must be a finite number >= 0, got -0.1"),
    ({"lr": math.nan}, "TrainParams: lr must be a finite number >= 0, got nan"),
    ({"lr": "0.1"}, "TrainParams: lr must be a finite number"),
    ({"lr": 0.1, "l1": -1.0}, "TrainParams: l1 must be a finite number >= 0"),
    ({"lr": 0.1, "l2": -1.0}, "TrainParams: l2 must be a finite number >= 0"),
    ({"lr": 0.1, "clip_norm": 0.0}, "TrainParams: clip_norm must be a finite number > 0"),
    ({"lr": 0.1, "clip_norm": -2.0}, "TrainParams: clip_norm must be a finite number > 0"),
    ({"lr": 0.1, "clip_value": 0}, "TrainParams: clip_value must be a finite number > 0"),
    ({"lr": 0.1, "clip_value": math.inf}, "TrainParams: clip_value must be a finite number > 0"),
])
def test_train_params_reject_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        optim.TrainParams(**kwargs)


def test_train_params_reject_a_schedule_that_is_not_callable() -> None:
    with pytest.raises(TypeError, match="TrainParams: schedule must be a callable"):
        optim.TrainParams(0.1, schedule=0.5)  # type: ignore[arg-type]


def test_train_params_store_plain_floats() -> None:
    params = optim.TrainParams(np.float32(0.1), l2=np.float64(0.5), clip_norm=1)
    assert type(params.lr) is float and type(params.l2) is float
    assert type(params.clip_norm) is float


# ------------------------------------------------------------ learning-rate scales

SCALED: dict[str, tuple[Any, dict]] = {
    "sgd": (optim.SGD, {"momentum": 0.9, "nesterov": True, "weight_decay": 0.1}),
    "rmsprop": (optim.RMSProp, {"momentum": 0.5}),
    "adam": (optim.Adam, {"weight_decay": 0.1}),
    "adamw": (optim.AdamW, {"weight_decay": 0.5}),
}


@DTYPES
@pytest.mark.parametrize("name", list(SCALED))
def test_lr_scale_scales_the_whole_update(name: str, dtype: type) -> None:
    cls, kwargs = SCALED[name]
    train = optim.TrainParams(0.05, l1=0.01, l2=0.01)
    values = initial_values(dtype)
    grads = random_grads(values, steps=4)
    # Three steps to fill the buffers, then one step from the same state with and without.
    warm = pb_params(values)
    warm_opt = cls(warm, train, **kwargs)
    run_pb(warm_opt, warm, grads[:3])
    state = warm_opt.state_dict()
    changes = []
    for scale in (1.0, 0.3):
        params = pb_params([p.numpy() for p in warm])
        opt = cls(params, train, **kwargs)
        opt.load_state_dict(state)
        optim.set_lr_scale(params[0], scale)
        before = [p.numpy().copy() for p in params]
        opt.apply(list(zip(params, grads[3])))
        changes.append([p.numpy() - b for p, b in zip(params, before)])
    tol = {"rtol": 1e-5, "atol": 1e-7} if dtype == np.float32 else {"rtol": 1e-12}
    np.testing.assert_allclose(changes[1][0], 0.3 * changes[0][0], **tol)
    for unscaled, scaled in zip(changes[0][1:], changes[1][1:]):
        np.testing.assert_array_equal(unscaled, scaled)


def test_lr_scale_zero_freezes_a_parameter() -> None:
    params = pb_params(initial_values(np.float32))
    optim.set_lr_scale(params[1], 0.0)
    before = params[1].numpy().copy()
    opt = optim.AdamW(params, 0.1)
    run_pb(opt, params, random_grads(initial_values(np.float32), steps=3))
    np.testing.assert_array_equal(params[1].numpy(), before)


def test_lr_scale_defaults_to_one_and_is_per_tensor() -> None:
    a, b = pb.tensor([1.0, 2.0], requires_grad=True), pb.tensor([1.0, 2.0], requires_grad=True)
    assert optim.lr_scale(a) == 1.0
    optim.set_lr_scale(a, 0.5)
    assert optim.lr_scale(a) == 0.5 and optim.lr_scale(b) == 1.0
    optim.set_lr_scale(a, 2)
    assert optim.lr_scale(a) == 2.0
    optim.set_lr_scale(a, 1.0)
    assert optim.lr_scale(a) == 1.0


def test_lr_scale_is_forgotten_with_its_tensor() -> None:
    from pullback.optim import scales as registry

    before = len(registry._scales)
    t = pb.tensor(np.zeros(3, np.float32), requires_grad=True)
    optim.set_lr_scale(t, 0.1)
    assert len(registry._scales) == before + 1
    del t
    gc.collect()
    assert len(registry._scales) == before


def test_set_lr_scale_rejects_bad_arguments() -> None:
    t = pb.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match="set_lr_scale: scale must be a finite number >= 0"):
        optim.set_lr_scale(t, -1.0)
    with pytest.raises(TypeError, match="set_lr_scale: expected a pullback Tensor"):
        optim.set_lr_scale(np.zeros(1), 0.5)  # type: ignore[arg-type]
