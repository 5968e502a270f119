"""The applyer machinery: step and apply, zero_grad, state dicts, write protection,
and errors for bad arguments."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from optim_oracle import initial_values, pb_params, random_grads, run_pb

import pullback as pb
from pullback import optim

TRAIN = optim.TrainParams(0.05, l2=0.01, clip_norm=3.0, schedule=optim.cosine(10))

# Every applyer, every buffer layout.
CONFIGS: dict[str, tuple[Any, dict]] = {
    "sgd": (optim.SGD, {}),
    "sgd_momentum": (optim.SGD, {"momentum": 0.9, "weight_decay": 0.01}),
    "sgd_nesterov": (optim.SGD, {"momentum": 0.9, "nesterov": True}),
    "rmsprop": (optim.RMSProp, {"beta": 0.9}),
    "rmsprop_momentum": (optim.RMSProp, {"beta": 0.9, "momentum": 0.9}),
    "adam": (optim.Adam, {"weight_decay": 0.1}),
    "adamw": (optim.AdamW, {}),
}
BUFFERS = {
    "sgd": [], "sgd_momentum": ["momentum"], "sgd_nesterov": ["momentum"],
    "rmsprop": ["square_avg"], "rmsprop_momentum": ["square_avg", "momentum"],
    "adam": ["step", "exp_avg", "exp_avg_sq"], "adamw": ["step", "exp_avg", "exp_avg_sq"],
}
ALL = pytest.mark.parametrize("name", list(CONFIGS))


def step_keys(state: dict) -> list[str]:
    """The state dict's keys besides the parameter groups' (test_optim_groups.py)."""
    return sorted(k for k in state if not k.startswith("param_groups."))


def build(name: str, values: list[np.ndarray], lr: Any = TRAIN) -> tuple[Any, list[pb.Tensor]]:
    cls, kwargs = CONFIGS[name]
    params = pb_params(values)
    return cls(params, lr, **kwargs), params


@ALL
def test_apply_equals_step_and_leaves_grad_alone(name: str) -> None:
    values = initial_values(np.float32)
    grads = random_grads(values, steps=4)
    stepped, stepped_params = build(name, values)
    applied, applied_params = build(name, values)
    run_pb(stepped, stepped_params, grads)
    marker = pb.tensor([7.0])
    for step_grads in grads:
        for p in applied_params:
            p.grad = marker
        # Arrays for some, tensors for others: both are accepted.
        applied.apply([(p, g if i % 2 else pb.tensor(g))
                       for i, (p, g) in enumerate(zip(applied_params, step_grads))])
        assert all(p.grad is marker for p in applied_params)
    for a, b in zip(stepped_params, applied_params):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert stepped.step_count == applied.step_count == 4


def test_apply_takes_any_subset_in_any_order() -> None:
    values = initial_values(np.float64)
    grads = random_grads(values, steps=1)[0]
    in_order, a = build("adam", values)
    reordered, b = build("adam", values)
    in_order.apply([(a[0], grads[0]), (a[2], grads[2])])
    reordered.apply([(b[2], grads[2]), (b[0], grads[0])])
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    np.testing.assert_array_equal(a[1].numpy(), values[1])
    assert step_keys(in_order.state_dict()) == [
        "state.0.exp_avg", "state.0.exp_avg_sq", "state.0.step",
        "state.2.exp_avg", "state.2.exp_avg_sq", "state.2.step", "step_count"]


def test_zero_grad_clears_every_gradient() -> None:
    opt, params = build("sgd", initial_values(np.float32))
    for p in params:
        p.grad = pb.ones_like(p)
    opt.zero_grad()
    assert all(p.grad is None for p in params)


def test_step_without_gradients_changes_no_parameter_but_counts() -> None:
    values = initial_values(np.float32)
    opt, params = build("adamw", values)
    opt.step()
    for p, v in zip(params, values):
        np.testing.assert_array_equal(p.numpy(), v)
    assert opt.step_count == 1 and step_keys(opt.state_dict()) == ["step_count"]


def test_params_and_step_count_are_exposed() -> None:
    opt, params = build("sgd_momentum", initial_values(np.float32), lr=0.1)
    assert opt.params == params and opt.step_count == 0 and opt.lr == 0.1
    assert isinstance(opt, optim.GradApplyer)
    assert opt.train_params == optim.TrainParams(0.1)
    assert repr(opt) == "SGD(3 parameters, lr=0.1, momentum=0.9, nesterov=False, weight_decay=0.01)"


def test_params_may_come_from_a_generator() -> None:
    params = pb_params(initial_values(np.float32))
    assert optim.Adam((p for p in params), 0.1).params == params


# ------------------------------------------------------------ state dicts

@ALL
def test_state_dict_holds_step_count_and_buffers_by_param_index(name: str) -> None:
    values = initial_values(np.float32)
    opt, params = build(name, values)
    run_pb(opt, params, random_grads(values, steps=2))
    state = opt.state_dict()
    expected = {f"state.{i}.{b}" for i in range(len(values)) for b in BUFFERS[name]}
    assert set(step_keys(state)) == expected | {"step_count"}
    assert state["step_count"].shape == () and state["step_count"].dtype == np.int64
    assert int(state["step_count"]) == 2
    for key, value in state.items():
        if key.startswith("param_groups."):
            continue
        if key.endswith(".step"):
            assert value.shape == () and value.dtype == np.int64 and int(value) == 2
        elif key != "step_count":
            index = int(key.split(".")[1])
            assert value.shape == values[index].shape and value.dtype == np.float32
    # Copies: a later step does not change what was saved.
    saved = {k: v.copy() for k, v in state.items()}
    run_pb(opt, params, random_grads(values, steps=1))
    for key in saved:
        np.testing.assert_array_equal(state[key], saved[key])


@ALL
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_state_dict_round_trip_continues_bit_for_bit(name: str, dtype: type) -> None:
    values = initial_values(dtype)
    grads = random_grads(values, steps=7)
    original, params = build(name, values)
    run_pb(original, params, grads[:3])
    state = original.state_dict()
    # A fresh applyer over copies of the parameters; tensors are accepted as well as arrays.
    restored, copies = build(name, [p.numpy() for p in params])
    restored.load_state_dict({k: pb.tensor(v) if k.endswith("avg") else v
                              for k, v in state.items()})
    assert restored.step_count == 3 and restored.lr == original.lr
    ours = run_pb(original, params, grads[3:])
    theirs = run_pb(restored, copies, grads[3:])
    for a, b in zip(ours, theirs):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    for key, value in original.state_dict().items():
        np.testing.assert_array_equal(value, restored.state_dict()[key])


def test_loading_an_earlier_state_forgets_later_buffers() -> None:
    values = initial_values(np.float64)
    opt, params = build("sgd_momentum", values)
    empty = opt.state_dict()
    run_pb(opt, params, random_grads(values, steps=2))
    opt.load_state_dict(empty)
    assert step_keys(opt.state_dict()) == ["step_count"] and opt.step_count == 0


def state_after_a_step(name: str) -> tuple[Any, dict[str, np.ndarray]]:
    values = initial_values(np.float32)
    opt, params = build(name, values)
    run_pb(opt, params, random_grads(values, steps=1))
    return opt, opt.state_dict()


@pytest.mark.parametrize(("edit", "error", "message"), [
    (lambda d: d.pop("step_count"), KeyError, "missing key 'step_count'"),
    (lambda d: d.update({"state.0.velocity": np.zeros((3, 4), np.float32)}), KeyError,
     r"unexpected key 'state.0.velocity'; expected 'step_count' and 'state.<i>.<buffer>' "
     r"with i < 3 and buffer one of \['step', 'exp_avg', 'exp_avg_sq'\]"),
    (lambda d: d.update({"state.3.exp_avg": np.zeros(2, np.float32)}), KeyError,
     "unexpected key 'state.3.exp_avg'"),
    (lambda d: d.update({"lr": np.zeros(())}), KeyError, "unexpected key 'lr'"),
    (lambda d: d.pop("state.1.exp_avg_sq"), KeyError,
     "parameter 1 has .* but is missing 'state.1.exp_avg_sq'"),
    (lambda d: d.update({"state.0.exp_avg": np.zeros((4, 3), np.float32)}), ValueError,
     r"'state.0.exp_avg' is \(4, 3\) float32 but parameter 0 \(\(3, 4\) float32\) needs "
     r"floats of shape \(3, 4\)"),
    (lambda d: d.update({"state.2.step": np.zeros(1, np.int64)}), ValueError,
     "'state.2.step' is .* needs a 0-d integer count"),
    (lambda d: d.update({"step_count": np.array(1.5)}), ValueError,
     "'step_count' must be a 0-d integer array >= 0"),
    (lambda d: d.update({"step_count": np.array(-1)}), ValueError,
     "'step_count' must be a 0-d integer array >= 0"),
    (lambda d: d.update({"state.0.exp_avg": [[0.0] * 4] * 3}), TypeError,
     "'state.0.exp_avg' must be a Tensor or a NumPy array"),
])
def test_load_state_dict_rejects_a_mismatch_and_changes_nothing(
        edit: Any, error: type, message: str) -> None:
    opt, state = state_after_a_step("adam")
    bad = dict(state)
    edit(bad)
    with pytest.raises(error, match=f"Adam.load_state_dict: {message}"):
        opt.load_state_dict(bad)
    for key, value in opt.state_dict().items():
        np.testing.assert_array_equal(value, state[key])


def test_load_state_dict_wants_a_mapping() -> None:
    opt, _ = state_after_a_step("sgd")
    with pytest.raises(TypeError, match=r"SGD\.load_state_dict: expected a dict of arrays"):
        opt.load_state_dict([("step_count", np.array(0))])  # type: ignore[arg-type]


# ------------------------------------------------------------ write protection

@pytest.mark.parametrize("verb", ["step", "apply"])
def test_writing_a_parameter_a_pending_backward_needs_raises_naming_the_op(verb: str) -> None:
    p = pb.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    x = pb.tensor(np.array([0.5, 0.5, 0.5], np.float32), requires_grad=True)
    y = (p * x).sum()  # mul saves p, as x's gradient needs it
    opt = optim.SGD([p], 0.1, momentum=0.9)
    grad = np.ones(3, np.float32)
    p.grad = pb.tensor(grad)
    with pytest.raises(RuntimeError, match=rf"SGD\.{verb}: .*pending backward of mul"):
        opt.step() if verb == "step" else opt.apply([(p, grad)])
    np.testing.assert_array_equal(p.numpy(), [1.0, 2.0, 3.0])
    assert opt.step_count == 0 and step_keys(opt.state_dict()) == ["step_count"]
    y.backward()  # accumulates x into p.grad: 1 + 0.5
    opt.step()
    np.testing.assert_allclose(p.numpy(), np.array([1.0, 2.0, 3.0]) - 0.1 * 1.5, rtol=1e-6)


def test_a_failing_parameter_stops_the_whole_step() -> None:
    a = pb.tensor(np.ones(2, np.float32), requires_grad=True)
    b = pb.tensor(np.ones(2, np.float32), requires_grad=True)
    x = pb.tensor(np.ones(2, np.float32), requires_grad=True)
    _ = (b * x).sum()
    opt = optim.Adam([a, b], 0.1)
    a.grad = b.grad = pb.ones(2)
    with pytest.raises(RuntimeError, match=r"Adam\.step"):
        opt.step()
    np.testing.assert_array_equal(a.numpy(), [1.0, 1.0])


# ------------------------------------------------------------ bad arguments

def test_gradient_shape_or_dtype_mismatch_names_both() -> None:
    p = pb.tensor(np.zeros((3, 4), np.float32), requires_grad=True)
    opt = optim.Adam([p], 0.1)
    p.grad = pb.tensor(np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match=r"Adam.step: the gradient of parameter 0 is \(4, 3\) "
                                         r"float32 but the parameter is \(3, 4\) float32"):
        opt.step()
    with pytest.raises(ValueError, match=r"Adam.apply: the gradient of parameter 0 is \(3, 4\) "
                                         r"float64 but the parameter is \(3, 4\) float32"):
        opt.apply([(p, np.zeros((3, 4)))])


def test_apply_rejects_foreign_repeated_and_malformed_pairs() -> None:
    params = pb_params(initial_values(np.float32))
    opt = optim.SGD(params, 0.1)
    stranger = pb.tensor(np.zeros(2, np.float32), requires_grad=True)
    with pytest.raises(ValueError, match=r"SGD.apply: parameter \(2,\) float32 is not one of"):
        opt.apply([(stranger, np.zeros(2, np.float32))])
    with pytest.raises(ValueError, match=r"SGD\.apply: parameter 1 appears twice"):
        opt.apply([(params[1], np.zeros(5, np.float32))] * 2)
    with pytest.raises(TypeError, match=r"SGD.apply: expected \(param, grad\) pairs"):
        opt.apply([params[0]])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="gradient of parameter 0 must be a Tensor or a NumPy"):
        opt.apply([(params[0], [[0.0] * 4] * 3)])


@pytest.mark.parametrize(("make", "error", "message"), [
    (lambda ps: optim.SGD([], 0.1), ValueError, "SGD: got an empty parameter list"),
    (lambda ps: optim.SGD(ps[0], 0.1), TypeError, "SGD: params must be an iterable of Tensors"),
    (lambda ps: optim.SGD(5, 0.1), TypeError, "SGD: params must be an iterable of Tensors"),
    (lambda ps: optim.SGD([np.zeros(2)], 0.1), TypeError, "SGD: parameter 0 is a ndarray"),
    (lambda ps: optim.SGD([pb.tensor([1, 2])], 0.1), TypeError,
     r"SGD: parameter 0 \(\(2,\) int64\) is not floating point"),
    (lambda ps: optim.SGD([ps[0] * 2], 0.1), ValueError, "only leaf tensors can be optimized"),
    (lambda ps: optim.SGD([ps[0], ps[1], ps[0]], 0.1), ValueError,
     "SGD: parameters 0 and 2 are the same tensor"),
    (lambda ps: optim.SGD(ps, -0.1), ValueError, "SGD: lr must be a finite number >= 0"),
    (lambda ps: optim.SGD(ps, None), ValueError, "SGD: lr must be a finite number >= 0"),
    (lambda ps: optim.SGD(ps, 0.1, momentum=-0.9), ValueError, "SGD: momentum must be"),
    (lambda ps: optim.SGD(ps, 0.1, nesterov=True), ValueError,
     "SGD: nesterov momentum needs momentum > 0"),
    (lambda ps: optim.SGD(ps, 0.1, momentum=0.9, nesterov="yes"), TypeError,
     "SGD: nesterov must be True or False"),
    (lambda ps: optim.SGD(ps, 0.1, weight_decay=-1), ValueError, "SGD: weight_decay must be"),
    (lambda ps: optim.RMSProp(ps, 0.1, beta=1.0), ValueError,
     "RMSProp: beta must be a finite number >= 0 and < 1"),
    (lambda ps: optim.RMSProp(ps, 0.1, momentum=-1), ValueError, "RMSProp: momentum must be"),
    (lambda ps: optim.RMSProp(ps, 0.1, eps=-1e-8), ValueError, "RMSProp: eps must be"),
    (lambda ps: optim.Adam(ps, 0.1, betas=(0.9, 1.0)), ValueError,
     r"Adam: betas\[1\] must be a finite number >= 0 and < 1, got 1.0"),
    (lambda ps: optim.Adam(ps, 0.1, betas=(-0.1, 0.9)), ValueError, r"Adam: betas\[0\] must"),
    (lambda ps: optim.Adam(ps, 0.1, betas=0.9), ValueError, "Adam: betas must be a pair"),
    (lambda ps: optim.AdamW(ps, 0.1, eps=-1.0), ValueError, "AdamW: eps must be"),
    (lambda ps: optim.AdamW(ps, 0.1, weight_decay=-0.01), ValueError,
     "AdamW: weight_decay must be"),
])
def test_applyers_reject_bad_arguments(make: Any, error: type, message: str) -> None:
    params = pb_params(initial_values(np.float32))
    with pytest.raises(error, match=message):
        make(params)


def test_adamw_defaults_to_weight_decay_one_hundredth() -> None:
    opt = optim.AdamW(pb_params(initial_values(np.float32)), 0.1)
    assert opt.weight_decay == 0.01 and opt.betas == (0.9, 0.999) and opt.eps == 1e-8
    assert optim.Adam(opt.params, 0.1).weight_decay == 0.0


def test_state_dict_survives_a_safetensors_round_trip() -> None:
    # What checkpoints store it in: flat string keys, arrays, 0-d counts included.
    from safetensors.numpy import load, save

    opt, state = state_after_a_step("adamw")
    opt.load_state_dict(load(save(state)))
    for key, value in opt.state_dict().items():
        np.testing.assert_array_equal(value, state[key])
        assert value.dtype == state[key].dtype


def test_the_bare_base_applyer_says_it_has_no_update_rule() -> None:
    import pullback as pb
    from pullback import optim

    p = pb.tensor([1.0, 2.0], requires_grad=True)
    p.grad = pb.tensor([0.5, 0.5])
    with pytest.raises(TypeError, match=r"no update rule.*SGD"):
        optim.GradApplyer([p], 0.1).step()


@ALL
def test_prepared_updates_follow_new_arrays_and_any_gradient_layout(name: str) -> None:
    # From its second step an applyer runs each parameter's fused update through a launch
    # prepared for that parameter's arrays: a gradient in another memory order, and a
    # parameter or state array replaced between steps, must still update what they should.
    rng = np.random.default_rng(3)
    values = [rng.standard_normal((6, 5)).astype(np.float32)]
    grads = [np.asfortranarray(rng.standard_normal((6, 5)).astype(np.float32))
             for _ in range(4)]
    opt, (p,) = build(name, values, lr=0.05)
    ref_opt, (ref,) = build(name, values, lr=0.05)
    for step, g in enumerate(grads):
        if step == 2:  # new arrays under the same parameter, and the state reloaded
            p._data = p._data.copy()
            opt.load_state_dict(opt.state_dict())
        opt.apply([(p, g)])
        ref_opt.apply([(ref, np.ascontiguousarray(g))])
        np.testing.assert_array_equal(p.numpy(), ref.numpy())
