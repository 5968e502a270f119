"""Module registration, state dicts, train/eval, dropout, losses, update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback import nn, optim


class Tower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Dense(4, 6)
        self.blocks = [nn.Dense(6, 6), nn.Dense(6, 6)]
        self.head = nn.Sequential(nn.ReLU(), nn.Dense(6, 2))
        self.scale = nn.Parameter(pb.ones(2))
        self.register_buffer("steps", np.zeros((), np.int64))

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x) * self.scale


def test_parameters_are_registered_from_attributes_children_and_lists() -> None:
    names = [n for n, _ in Tower().named_parameters()]
    assert names == ["scale", "stem.weight", "stem.bias", "blocks.0.weight", "blocks.0.bias",
                     "blocks.1.weight", "blocks.1.bias", "head.1.weight", "head.1.bias"]


def test_state_dict_holds_parameters_and_buffers_by_name() -> None:
    model = Tower()
    state = model.state_dict()
    # PyTorch's order: a module's parameters, its buffers, then its children's.
    names = [n for n, _ in model.named_parameters()]
    assert list(state) == names[:1] + ["steps"] + names[1:]
    assert state["stem.weight"] is model.stem.weight


def test_load_state_dict_copies_values_from_arrays_and_tensors() -> None:
    a, b = Tower(), Tower()
    b.load_state_dict({n: (t.numpy() if i % 2 else t) for i, (n, t) in
                       enumerate(a.state_dict().items())})
    for (n, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=n)
    assert b.stem.weight is not a.stem.weight


def test_load_state_dict_lists_every_problem_at_once() -> None:
    model = Tower()
    state = {n: t.numpy() for n, t in model.state_dict().items()}
    del state["scale"]
    state["extra"] = np.zeros(1)
    state["stem.bias"] = np.zeros(7, np.float32)
    state["head.1.bias"] = np.zeros(2, np.float64)
    with pytest.raises(ValueError) as err:
        model.load_state_dict(state)
    message = str(err.value)
    for part in ("missing: 'scale'", "unexpected: 'extra'", "'stem.bias': expected (6,) float32, "
                 "got (7,) float32", "'head.1.bias': expected (2,) float32, got (2,) float64"):
        assert part in message


def test_train_and_eval_set_the_mode_recursively() -> None:
    model = Tower()
    model.eval()
    assert not model.training and not model.head[0].training and not model.blocks[1].training
    model.train()
    assert model.head[1].training


def test_dropout_is_seeded_scaled_and_the_identity_in_eval() -> None:
    x = pb.ones(1000, 10)
    a, b = nn.Dropout(0.25, seed=7), nn.Dropout(0.25, seed=7)
    ya, yb = a(x).numpy(), b(x).numpy()
    np.testing.assert_array_equal(ya, yb)
    assert set(np.unique(ya)) == {0.0, np.float32(1 / 0.75)}
    assert abs((ya == 0).mean() - 0.25) < 0.02
    a.eval()
    assert a(x) is x


def test_parameter_names_reach_rule_five_errors() -> None:
    from pullback.ops import declare

    no_rule = declare("opaque", lambda backend, x: x * 2.0, lambda x: (x.shape, x.dtype),
                      register=False)
    model = nn.Sequential(nn.Dense(3, 2))
    loss = no_rule.bind(model(pb.ones(1, 3))).sum()
    with pytest.raises(pb.ad.DerivativeError, match=r"opaque.*0\.weight"):
        loss.backward()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_matches_torch(dtype) -> None:
    rng = np.random.default_rng(0)
    logits0 = (rng.standard_normal((6, 4)) * 30).astype(dtype)  # large: stability matters
    labels = rng.integers(0, 4, 6)
    logits = pb.tensor(logits0, requires_grad=True)
    loss = nn.cross_entropy(logits, labels)
    loss.backward()
    t = torch.tensor(logits0, requires_grad=True)
    tl = torch.nn.functional.cross_entropy(t, torch.tensor(labels))
    tl.backward()
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert loss.dtype == dtype
    np.testing.assert_allclose(loss.item(), tl.item(), rtol=tol)
    np.testing.assert_allclose(logits.grad.numpy(), t.grad.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("labels, match", [
    (np.array([0, 4]), r"\[0, 4\)"), (np.array([0.0, 1.0]), "integers"),
    (np.array([0, 1, 2]), r"labels of shape \(2,\)"),
])
def test_cross_entropy_rejects_bad_labels(labels, match) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        nn.cross_entropy(pb.zeros(2, 4), labels)


def test_mse_loss_matches_torch() -> None:
    rng = np.random.default_rng(0)
    p0, t0 = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    p = pb.tensor(p0, requires_grad=True)
    nn.mse_loss(p, pb.tensor(t0)).backward()
    tp = torch.tensor(p0, requires_grad=True)
    torch.nn.functional.mse_loss(tp, torch.tensor(t0)).backward()
    np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="same shape"):
        nn.mse_loss(p, pb.zeros(4, 3))


def test_update_applies_backprop_gradients_like_step() -> None:
    pb.manual_seed(0)
    a = nn.Sequential(nn.Dense(4, 3), nn.Tanh(), nn.Dense(3, 2))
    b = nn.Sequential(nn.Dense(4, 3), nn.Tanh(), nn.Dense(3, 2))
    b.load_state_dict(a.state_dict())
    x, g = pb.randn(5, 4, seed=1), pb.randn(5, 2, seed=2)
    params = optim.TrainParams(lr=0.1)
    applyer = a.new_momentum(params, 0.9)
    opt = optim.SGD(b.parameters(), 0.1, momentum=0.9)
    for _ in range(3):
        _, trace = a.traced_forward(x)
        _, grads = a.backprop(trace, g)
        a.update(applyer, grads)
        opt.zero_grad()
        (b(x) * g).sum().backward()
        opt.step()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-6, err_msg=n)


def test_lr_scales_updates_exactly() -> None:
    pb.manual_seed(0)
    plain, scaled = nn.Dense(3, 2), nn.LR(nn.Dense(3, 2), 0.25)
    scaled.module.load_state_dict(plain.state_dict())
    x = pb.randn(4, 3, seed=1)
    changes = []
    for model in (plain, scaled):
        before = [p.numpy().copy() for p in model.parameters()]
        opt = optim.SGD(model.parameters(), 0.5)
        model(x).sum().backward()
        opt.step()
        changes.append([p.numpy() - b for p, b in zip(model.parameters(), before)])
    for c_plain, c_scaled in zip(*changes):
        np.testing.assert_allclose(c_scaled, 0.25 * c_plain, rtol=1e-6)


def test_dropout_backprop_agrees_with_autograd_for_the_same_mask() -> None:
    x0, g = pb.randn(6, 5, seed=1), pb.randn(6, 5, seed=2)
    traced = nn.Dropout(0.5, seed=3)
    y, trace = traced.traced_forward(x0)
    grad_x, grads = traced.backprop(trace, g)
    x = pb.tensor(x0.numpy(), requires_grad=True)
    y_auto = nn.Dropout(0.5, seed=3)(x)  # same seed, same mask
    (y_auto * g).sum().backward()
    np.testing.assert_array_equal(y.numpy(), y_auto.numpy())
    np.testing.assert_array_equal(grad_x.numpy(), x.grad.numpy())
    assert grads == {} and (grad_x.numpy() == 0).any()


@pytest.mark.parametrize("make, torch_kwargs", [
    (lambda m, tp: m.new_rmsprop(tp, 0.95), {"alpha": 0.95}),
    (lambda m, tp: m.new_rmsprop_with_momentum(tp, 0.8, 0.95), {"alpha": 0.95, "momentum": 0.8}),
])
def test_module_rmsprop_applyers_match_torch(make, torch_kwargs) -> None:
    pb.manual_seed(0)
    model = nn.Dense(4, 3, dtype=np.float64)
    tmodel = torch.nn.Linear(4, 3).double()
    with torch.no_grad():
        for tp, p in zip(tmodel.parameters(), model.parameters()):
            tp.copy_(torch.from_numpy(p.numpy().copy()))
    applyer = make(model, optim.TrainParams(lr=0.01))
    topt = torch.optim.RMSprop(tmodel.parameters(), lr=0.01, eps=1e-8, **torch_kwargs)
    x = np.random.default_rng(0).standard_normal((5, 4))
    for _ in range(4):
        _, trace = model.traced_forward(pb.tensor(x))
        _, grads = model.backprop(trace, pb.ones(5, 3, dtype=np.float64))
        model.update(applyer, grads)
        topt.zero_grad()
        tmodel(torch.from_numpy(x)).sum().backward()
        topt.step()
    for p, tp in zip(model.parameters(), tmodel.parameters()):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-10)


def test_backprop_of_an_integer_input_gives_parameter_gradients_only() -> None:
    class Lookup(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(pb.randn(5, 3, seed=0))

        def forward(self, ids):
            return self.table[ids.numpy()]

    module = Lookup()
    _, trace = module.traced_forward(np.array([0, 2, 2]))
    grad_input, grads = module.backprop(trace, pb.ones(3, 3))
    assert grad_input is None
    np.testing.assert_array_equal(grads["table"].numpy()[:, 0], [1, 0, 2, 0, 0])


def _sgd_change(model: nn.Module, x: pb.Tensor) -> list[np.ndarray]:
    before = [p.numpy().copy() for p in model.parameters()]
    opt = optim.SGD(model.parameters(), 0.5)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    return [p.numpy() - b for p, b in zip(model.parameters(), before)]


def test_lr_scale_belongs_to_the_wrapper() -> None:
    import gc

    pb.manual_seed(0)
    inner = nn.Dense(3, 2, dtype=np.float64)
    start = {n: p.numpy().copy() for n, p in inner.named_parameters()}
    x = pb.randn(4, 3, seed=1, dtype=np.float64)

    def change(model: nn.Module) -> list[np.ndarray]:
        inner.load_state_dict(start)
        return _sgd_change(model, x)

    plain = change(inner)
    nested = nn.LR(nn.LR(inner, 0.5), 0.5)  # nested wrappers multiply: exactly 0.25
    assert optim.lr_scale(inner.weight) == 0.25
    for c, p in zip(change(nested), plain):
        np.testing.assert_allclose(c, 0.25 * p, rtol=1e-12)
    del nested
    gc.collect()
    # Dropping the wrappers restores the module's own updates: nothing stayed on the
    # parameters, so wrapping again does not compound with the old wrappers.
    assert optim.lr_scale(inner.weight) == 1.0
    for c, p in zip(change(inner), plain):
        np.testing.assert_allclose(c, p, rtol=1e-12)
    again = nn.LR(inner, 0.5)
    for c, p in zip(change(again), plain):
        np.testing.assert_allclose(c, 0.5 * p, rtol=1e-12)
    # The explicit loop goes through the same scale, which is the wrapper's to change.
    again.scale = 0.25
    inner.load_state_dict(start)
    _, trace = again.traced_forward(x)
    _, grads = again.backprop(trace, pb.ones(4, 2, dtype=np.float64))
    again.update(optim.SGD(again.parameters(), 0.5), grads)
    for (name, p), c in zip(inner.named_parameters(), plain):
        np.testing.assert_allclose(p.numpy() - start[name], 0.25 * c, rtol=1e-12)


def test_lr_refuses_a_bad_scale() -> None:
    for bad in (-1.0, float("inf"), "0.5", True):
        with pytest.raises(ValueError, match="LR: scale must be a finite number >= 0"):
            nn.LR(nn.Dense(2, 2), bad)
