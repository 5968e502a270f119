"""Parameter groups as PyTorch's: per-group settings against torch.optim, settable
`param_groups[i]["lr"]`, schedules on top of group rates, and checkpoints that
restore groups exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from optim_oracle import assert_histories_close, initial_values, random_grads

import pullback as pb
from pullback import nn, optim
from pullback.io import load_training, save_training

# (our class, our defaults, our per-group settings, torch class, torch defaults, torch
# per-group settings); three groups, one per parameter of optim_oracle.SHAPES.
CASES: dict[str, tuple[Any, dict, list[dict], Any, dict, list[dict]]] = {
    "sgd": (optim.SGD, {"lr": 0.05, "momentum": 0.9},
            [{"nesterov": True, "weight_decay": 0.01}, {"lr": 0.2, "momentum": 0.5},
             {"momentum": 0.0, "weight_decay": 0.1}],
            torch.optim.SGD, {"lr": 0.05, "momentum": 0.9},
            [{"nesterov": True, "weight_decay": 0.01}, {"lr": 0.2, "momentum": 0.5},
             {"momentum": 0.0, "weight_decay": 0.1}]),
    "rmsprop": (optim.RMSProp, {"lr": 0.01},
                [{"beta": 0.95}, {"momentum": 0.9, "eps": 1e-4}, {"lr": 0.03}],
                torch.optim.RMSprop, {"lr": 0.01, "alpha": 0.9, "eps": 1e-8},
                [{"alpha": 0.95}, {"momentum": 0.9, "eps": 1e-4}, {"lr": 0.03}]),
    "adam": (optim.Adam, {"lr": 0.01},
             [{"weight_decay": 0.1}, {"betas": (0.3, 0.9)}, {"lr": 0.05, "eps": 1e-6}],
             torch.optim.Adam, {"lr": 0.01},
             [{"weight_decay": 0.1}, {"betas": (0.3, 0.9)}, {"lr": 0.05, "eps": 1e-6}]),
    "adamw": (optim.AdamW, {"lr": 0.02, "weight_decay": 0.1},
              [{}, {"weight_decay": 0.0}, {"weight_decay": 0.0, "lr": 0.04}],
              torch.optim.AdamW, {"lr": 0.02, "weight_decay": 0.1},
              [{}, {"weight_decay": 0.0}, {"weight_decay": 0.0, "lr": 0.04}]),
}


def run(opt: Any, params: list, grads: list, to_tensor: Any, lr_change: tuple | None = None,
        scheduler: Any = None) -> list[list[np.ndarray]]:
    """Step `opt` over `grads`; `lr_change` = (step, group, lr) sets a group's lr first."""
    history = []
    for step, step_grads in enumerate(grads):
        if lr_change is not None and step == lr_change[0]:
            opt.param_groups[lr_change[1]]["lr"] = lr_change[2]
        for p, g in zip(params, step_grads):
            p.grad = to_tensor(g)
        opt.step()
        if scheduler is not None:
            scheduler.step()
        history.append([np.array(p.detach().numpy()) for p in params])
    return history


def make(case: str, params: list, lr: Any = None) -> Any:
    """Our applyer of `case` over `params`, one group each."""
    cls, defaults, groups = CASES[case][:3]
    settings = {k: v for k, v in defaults.items() if k != "lr"}
    return cls([{"params": [p], **g} for p, g in zip(params, groups)],
               defaults["lr"] if lr is None else lr, **settings)


def pair(case: str, dtype: type) -> tuple:
    _, _, _, torch_cls, torch_defaults, torch_groups = CASES[case]
    values = initial_values(dtype)
    params = [pb.tensor(v.copy(), requires_grad=True) for v in values]
    tparams = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    theirs = torch_cls([{"params": [p], **g} for p, g in zip(tparams, torch_groups)],
                       **torch_defaults)
    return values, (make(case, params), params), (theirs, tparams)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", list(CASES))
def test_groups_match_torch_and_a_set_lr_takes_effect_at_the_next_step(case: str,
                                                                        dtype: type) -> None:
    values, (ours, params), (theirs, tparams) = pair(case, dtype)
    grads = random_grads(values)
    change = (3, 1, 0.003)
    mine = run(ours, params, grads, pb.tensor, change)
    ref = run(theirs, tparams, grads, torch.tensor, change)
    assert_histories_close(mine, ref)
    assert ours.param_groups[1]["lr"] == 0.003


def test_a_schedule_multiplies_each_group_lr_as_torch_lambdalr() -> None:
    # Our group lr is the base rate and the TrainParams schedule a factor on it, which
    # is torch's LambdaLR (lr = initial_lr * factor(step)).
    schedule = optim.step_decay(2, gamma=0.5)
    values, (_, params), (theirs, tparams) = pair("sgd", np.float64)
    ours = make("sgd", params, optim.TrainParams(0.05, schedule=schedule))
    scheduler = torch.optim.lr_scheduler.LambdaLR(theirs, schedule)
    grads = random_grads(values)
    assert_histories_close(run(ours, params, grads, pb.tensor),
                           run(theirs, tparams, grads, torch.tensor, scheduler=scheduler))
    assert ours.lr == 0.05 * schedule(len(grads)) and ours.param_groups[0]["lr"] == 0.05


@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpoint_restores_groups_and_continues_bit_for_bit(case: str,
                                                               tmp_path: Path) -> None:
    grads = random_grads(initial_values(np.float32), steps=6)

    def fresh() -> tuple[nn.Module, Any]:
        model = nn.Module()
        for i, v in enumerate(initial_values(np.float32)):
            setattr(model, f"p{i}", pb.tensor(v.copy(), requires_grad=True))
        return model, make(case, model.parameters())

    model, opt = fresh()
    params = model.parameters()
    run(opt, params, grads[:3], pb.tensor, (1, 2, 0.125))
    save_training(tmp_path / "run.safetensors", model=model, optimizer=opt, step=3)
    uninterrupted = run(opt, params, grads[3:], pb.tensor)

    restored, restored_opt = fresh()
    assert restored_opt.param_groups[2]["lr"] != 0.125
    load_training(tmp_path / "run.safetensors", model=restored, optimizer=restored_opt)
    assert restored_opt.param_groups[2]["lr"] == 0.125
    resumed = run(restored_opt, restored.parameters(), grads[3:], pb.tensor)
    for a, b in zip(uninterrupted, resumed):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    for (key, x), y in zip(opt.state_dict().items(), restored_opt.state_dict().values()):
        np.testing.assert_array_equal(x, y, err_msg=key)


def test_group_settings_round_trip_exactly_through_the_state_dict() -> None:
    p, q = pb.ones(2, requires_grad=True), pb.ones(3, requires_grad=True)
    opt = optim.Adam([{"params": [p], "betas": (0.8, 0.95)}, {"params": q, "lr": 1 / 3}], 0.1)
    state = opt.state_dict()
    np.testing.assert_array_equal(state["param_groups.0.params"], [0])
    np.testing.assert_array_equal(state["param_groups.1.params"], [1])
    other = optim.Adam([{"params": [pb.ones(2, requires_grad=True)]},
                        {"params": [pb.ones(3, requires_grad=True)]}], 0.5)
    other.load_state_dict(state)
    assert other.param_groups[0]["betas"] == (0.8, 0.95) and other.param_groups[0]["lr"] == 0.1
    assert other.param_groups[1]["lr"] == 1 / 3 and other.param_groups[1]["betas"] == (0.9, 0.999)


def test_a_state_dict_without_groups_keeps_the_current_settings() -> None:
    # As saved before applyers had groups: the step count and buffers only.
    p = pb.ones(2, requires_grad=True)
    opt = optim.SGD([p], 0.1, momentum=0.9)
    opt.load_state_dict({"step_count": np.array(4), "state.0.momentum": np.ones(2, np.float32)})
    assert opt.step_count == 4 and opt.param_groups[0]["momentum"] == 0.9


def test_turning_momentum_on_in_a_group_starts_its_buffer_as_torch() -> None:
    values = initial_values(np.float64)
    grads = random_grads(values)
    params = [pb.tensor(v.copy(), requires_grad=True) for v in values]
    tparams = [torch.tensor(v.copy(), requires_grad=True) for v in values]
    ours, theirs = optim.SGD(params, 0.1), torch.optim.SGD(tparams, 0.1)
    mine = run(ours, params, grads[:2], pb.tensor)
    ref = run(theirs, tparams, grads[:2], torch.tensor)
    ours.param_groups[0]["momentum"] = theirs.param_groups[0]["momentum"] = 0.9
    mine += run(ours, params, grads[2:], pb.tensor)
    ref += run(theirs, tparams, grads[2:], torch.tensor)
    assert_histories_close(mine, ref)


def test_bad_groups_are_refused_naming_the_group() -> None:
    a, b = pb.ones(2, requires_grad=True), pb.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match=r"SGD: parameter group 1 has unknown settings "
                                         r"\['weight_deacy'\]; a group may set"):
        optim.SGD([{"params": [a]}, {"params": [b], "weight_deacy": 0.0}], 0.1)
    with pytest.raises(ValueError, match="SGD: parameters 0 and 1 are the same tensor"):
        optim.SGD([{"params": [a]}, {"params": [a]}], 0.1)
    with pytest.raises(TypeError, match="parameter groups must all be dicts; item 1"):
        optim.SGD([{"params": [a]}, b], 0.1)
    with pytest.raises(ValueError, match="parameter group 0 has no 'params'"):
        optim.Adam([{"lr": 0.1}], 0.1)
    with pytest.raises(ValueError, match=r"Adam: parameter group 1: betas\[1\] must be"):
        optim.Adam([{"params": [a]}, {"params": [b], "betas": (0.9, 1.5)}], 0.1)
    with pytest.raises(ValueError, match="SGD: parameter group 0: nesterov momentum needs"):
        optim.SGD([{"params": [a], "nesterov": True}], 0.1)
    with pytest.raises(ValueError, match="got an empty parameter list"):
        optim.SGD([{"params": []}], 0.1)
    # An empty group beside others is fine, as in PyTorch (a model with no biases).
    assert len(optim.AdamW([{"params": [a]}, {"params": [], "weight_decay": 0.0}],
                           0.1).param_groups) == 2


def test_a_bad_setting_written_into_a_group_fails_the_step_before_any_write() -> None:
    a, b = pb.ones(2, requires_grad=True), pb.ones(2, requires_grad=True)
    opt = optim.SGD([{"params": [a]}, {"params": [b]}], 0.1)
    a.grad = b.grad = pb.ones(2)
    opt.param_groups[1]["lr"] = -1.0
    with pytest.raises(ValueError, match=r"SGD\.step: parameter group 1: lr must be"):
        opt.step()
    np.testing.assert_array_equal(a.numpy(), [1.0, 1.0])
    assert opt.step_count == 0


def test_constructor_settings_are_group_defaults_and_not_assignable() -> None:
    opt = optim.SGD([pb.ones(2, requires_grad=True)], 0.1, momentum=0.9)
    assert opt.momentum == 0.9 and opt.defaults["lr"] == 0.1
    with pytest.raises(AttributeError, match=r"param_groups\[i\]\['momentum'\]"):
        opt.momentum = 0.5


def test_loading_a_state_with_other_groups_is_refused_and_changes_nothing() -> None:
    a, b = pb.ones(2, requires_grad=True), pb.ones(3, requires_grad=True)
    two = optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], 0.1)
    one = optim.SGD([pb.ones(2, requires_grad=True), pb.ones(3, requires_grad=True)], 0.2)
    with pytest.raises(ValueError, match=r"parameter groups \[0, 1\], this applyer \[0\]"):
        one.load_state_dict(two.state_dict())
    assert one.param_groups[0]["lr"] == 0.2
    swapped = optim.SGD([{"params": [b]}, {"params": [a]}], 0.1)
    state = swapped.state_dict()
    state["param_groups.0.params"] = np.array([1])
    with pytest.raises(ValueError, match=r"group 0 holds parameters \[1\] in the state dict "
                                         r"but \[0\] here"):
        two.load_state_dict(state)
