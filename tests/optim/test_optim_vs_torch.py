"""Each applyer against PyTorch's optimizer of the same name, fed the same gradients."""

from __future__ import annotations

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

from pullback import optim

DTYPES = [np.float32, np.float64]

# (our class, our kwargs, torch class, torch kwargs)
CASES: dict[str, tuple[Any, dict, Any, dict]] = {
    "sgd": (optim.SGD, {"lr": 0.1}, torch.optim.SGD, {"lr": 0.1}),
    "sgd_momentum": (optim.SGD, {"lr": 0.05, "momentum": 0.9},
                     torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    "sgd_nesterov": (optim.SGD, {"lr": 0.05, "momentum": 0.8, "nesterov": True},
                     torch.optim.SGD, {"lr": 0.05, "momentum": 0.8, "nesterov": True}),
    "sgd_weight_decay": (optim.SGD, {"lr": 0.1, "weight_decay": 0.05},
                         torch.optim.SGD, {"lr": 0.1, "weight_decay": 0.05}),
    "sgd_momentum_weight_decay": (
        optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
        torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    "rmsprop": (optim.RMSProp, {"lr": 0.01},  # our default beta is 0.9, torch's alpha 0.99
                torch.optim.RMSprop, {"lr": 0.01, "alpha": 0.9, "eps": 1e-8}),
    "rmsprop_beta_eps": (optim.RMSProp, {"lr": 0.01, "beta": 0.95, "eps": 1e-3},
                         torch.optim.RMSprop, {"lr": 0.01, "alpha": 0.95, "eps": 1e-3}),
    "rmsprop_momentum": (optim.RMSProp, {"lr": 0.01, "beta": 0.9, "momentum": 0.9},
                         torch.optim.RMSprop,
                         {"lr": 0.01, "alpha": 0.9, "momentum": 0.9, "eps": 1e-8}),
    "adam": (optim.Adam, {"lr": 0.01}, torch.optim.Adam, {"lr": 0.01}),
    "adam_weight_decay": (optim.Adam, {"lr": 0.01, "weight_decay": 0.1},
                          torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.1}),
    # beta1 < 0.5 takes lerp's other formula.
    "adam_small_beta1": (optim.Adam, {"lr": 0.02, "betas": (0.3, 0.9), "eps": 1e-6},
                         torch.optim.Adam, {"lr": 0.02, "betas": (0.3, 0.9), "eps": 1e-6}),
    "adamw": (optim.AdamW, {"lr": 0.01}, torch.optim.AdamW, {"lr": 0.01}),
    "adamw_weight_decay": (optim.AdamW, {"lr": 0.03, "betas": (0.8, 0.99), "weight_decay": 0.2},
                           torch.optim.AdamW,
                           {"lr": 0.03, "betas": (0.8, 0.99), "weight_decay": 0.2}),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("case", list(CASES))
def test_applyer_matches_torch_optimizer(case: str, dtype: type) -> None:
    ours_cls, ours_kwargs, torch_cls, torch_kwargs = CASES[case]
    values = initial_values(dtype)
    grads = random_grads(values)
    params = pb_params(values)
    ours = run_pb(ours_cls(params, **ours_kwargs), params, grads)
    tparams = torch_params(values)
    theirs = run_torch(torch_cls(tparams, **torch_kwargs), tparams, grads)
    assert_histories_close(ours, theirs)


@pytest.mark.parametrize("case", ["sgd_momentum", "rmsprop_momentum", "adam", "adamw"])
def test_parameters_without_a_gradient_are_skipped_as_in_torch(case: str) -> None:
    # Adam's bias correction counts steps per parameter, as PyTorch's does.
    ours_cls, ours_kwargs, torch_cls, torch_kwargs = CASES[case]
    values = initial_values(np.float64)
    grads: list[list[Any]] = random_grads(values)
    grads[0][1] = None
    grads[2][0] = None
    grads[3][1] = None
    params = pb_params(values)
    ours = run_pb(ours_cls(params, **ours_kwargs), params, grads)
    tparams = torch_params(values)
    theirs = run_torch(torch_cls(tparams, **torch_kwargs), tparams, grads)
    assert_histories_close(ours, theirs)
    np.testing.assert_array_equal(ours[0][1], values[1])


@pytest.mark.parametrize("case", list(CASES))
def test_applyer_keeps_float32_parameters_and_buffers_float32(case: str) -> None:
    ours_cls, ours_kwargs, _, _ = CASES[case]
    params = pb_params(initial_values(np.float32))
    opt = ours_cls(params, **ours_kwargs)
    arrays = [p._data for p in params]
    run_pb(opt, params, random_grads(initial_values(np.float32), steps=2))
    for p, array in zip(params, arrays):
        assert p.dtype == np.float32
        assert p._data is array  # updated in place, never rebound
    for key, value in opt.state_dict().items():
        if key.startswith("param_groups."):
            continue  # float64 settings and int64 indices (test_optim_groups.py)
        assert value.dtype == (np.int64 if key.endswith("step") or key == "step_count"
                               else np.float32), key
