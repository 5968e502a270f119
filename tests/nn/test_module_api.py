"""Module's PyTorch API: modules/named_modules/children/apply against torch's walk,
zero_grad, to(dtype)/double()/float(), and load_state_dict(strict=...)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import pullback as pb
from pullback import nn, optim


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(3, 4)
        self.blocks = [nn.Sequential(nn.Linear(4, 4), nn.SiLU()), nn.Identity()]
        self.head = nn.ModuleDict({"out": nn.Linear(4, 2)})
        self.shared = self.stem  # the same module twice: walked once
        self.register_buffer("count", np.zeros((), np.int64))
        self.register_buffer("stats", np.ones(4, np.float32))

    def forward(self, x):
        x = self.blocks[0](self.stem(x))
        return self.head["out"](x)


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Linear(3, 4)
        self.blocks = torch.nn.ModuleList([
            torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SiLU()), torch.nn.Identity()])
        self.head = torch.nn.ModuleDict({"out": torch.nn.Linear(4, 2)})
        self.shared = self.stem
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        self.register_buffer("stats", torch.ones(4))


def test_the_module_walk_matches_torch() -> None:
    ours, theirs = Net(), TorchNet()
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    assert [type(m).__name__ for m in ours.children()] == \
        ["Dense", "ModuleList", "ModuleDict"]
    assert len(list(ours.modules())) == len(list(theirs.modules()))
    assert [n for n, _ in ours.named_modules(prefix="net")][:2] == ["net", "net.stem"]
    assert list(ours.state_dict()) == list(theirs.state_dict())


def test_apply_visits_children_first_and_returns_the_module() -> None:
    ours, theirs = Net(), TorchNet()
    seen: list[str] = []
    tseen: list[str] = []
    assert ours.apply(lambda m: seen.append(type(m).__name__)) is ours
    theirs.apply(lambda m: tseen.append(type(m).__name__))
    rename = {"Dense": "Linear"}
    assert [rename.get(n, n) for n in seen] == [n.replace("TorchNet", "Net") for n in tseen]


def test_apply_initializes_weights_in_place() -> None:
    model = Net()
    weights = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]

    def init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    model.apply(init)
    assert [m.weight for m in model.modules() if isinstance(m, nn.Linear)] == weights
    assert all((w.numpy() == 1).all() for w in weights)


def test_zero_grad_sets_none_or_zeros_in_place() -> None:
    model = Net()
    model(pb.ones(2, 3)).sum().backward()
    grads = [p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=False)
    assert all(p.grad is g and not g.numpy().any() for p, g in zip(model.parameters(), grads))
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("dtype", [pb.float64, np.float64, "float64"], ids=str)
def test_to_converts_parameters_and_float_buffers_in_place(dtype) -> None:
    model = Net()
    model(pb.ones(2, 3)).sum().backward()
    params = model.parameters()
    assert model.to(dtype) is model
    assert model.parameters() == params  # the same tensors
    for name, t in model.state_dict().items():
        expected = np.int64 if name == "count" else np.float64
        assert t.dtype == expected, name
    assert all(p.grad.dtype == np.float64 and p.requires_grad and p.is_leaf for p in params)
    y = model(pb.ones(2, 3, dtype=np.float64))
    y.sum().backward()
    assert y.dtype == np.float64 and model.stem.weight.grad.dtype == np.float64
    assert model.float() is model and model.stem.weight.dtype == np.float32
    assert model.count.dtype == np.int64
    assert model.double().stats.dtype == np.float64


def test_to_matches_torch_values_and_an_optimizer_follows() -> None:
    torch.manual_seed(0)
    tmodel = torch.nn.Sequential(torch.nn.Linear(3, 2))
    model = nn.Sequential(nn.Linear(3, 2))
    model.load_state_dict({k: v.detach().numpy() for k, v in tmodel.state_dict().items()})
    opt = optim.Adam(model.parameters(), 0.01)
    x0 = np.random.default_rng(0).standard_normal((4, 3))
    model(pb.tensor(x0, dtype=np.float32)).sum().backward()
    opt.step()
    model.double()
    tmodel.double()
    tmodel.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                            for k, v in model.state_dict().items()})
    np.testing.assert_allclose(model(pb.tensor(x0)).numpy(),
                               tmodel(torch.from_numpy(x0)).detach().numpy(), rtol=1e-12)
    opt.zero_grad()
    model(pb.tensor(x0)).sum().backward()
    opt.step()  # the float32 buffers follow the parameters to float64
    assert {v.dtype for k, v in opt.state_dict().items() if k.endswith("avg")} == \
        {np.dtype(np.float64)}


def test_to_refuses_what_it_cannot_do() -> None:
    model = Net()
    with pytest.raises(TypeError, match="to: a module converts to a float dtype"):
        model.to(np.int64)
    with pytest.raises(ValueError, match="pullback runs on the CPU"):
        model.to("cuda")
    assert model.to("cpu") is model and model.to("cpu", dtype="float64") is model
    assert model.stem.weight.dtype == np.float64
    w = model.stem.weight
    pending = (w * w).sum()  # mul saves the weight
    with pytest.raises(RuntimeError, match="to: cannot write into this tensor"):
        model.float()
    assert w.dtype == np.float64 and model.head["out"].weight.dtype == np.float64
    pending.backward()


def test_load_state_dict_strict_and_not() -> None:
    source = Net()
    state = {k: v.numpy() for k, v in source.state_dict().items()}
    target = Net()
    assert target.load_state_dict(state) == nn.IncompatibleKeys([], [])
    partial = {k: v for k, v in state.items() if k.startswith("stem.")}
    partial["extra.weight"] = np.zeros(2)
    with pytest.raises(ValueError, match=r"missing: .*'blocks\.0\.0\.weight'.*\n.*"
                                         r"unexpected: 'extra\.weight'"):
        Net().load_state_dict(partial)
    fresh = Net()
    before = fresh.head["out"].weight.numpy().copy()
    result = fresh.load_state_dict(partial, strict=False)
    assert result.missing_keys == [k for k in state if not k.startswith("stem.")]
    assert result.unexpected_keys == ["extra.weight"]
    missing, unexpected = result
    assert unexpected == ["extra.weight"] and "count" in missing
    np.testing.assert_array_equal(fresh.stem.weight.numpy(), state["stem.weight"])
    np.testing.assert_array_equal(fresh.head["out"].weight.numpy(), before)
    # A shape or dtype that does not fit still raises, and nothing is written.
    partial["stem.bias"] = np.zeros(5, np.float32)
    other = Net()
    kept = other.stem.weight.numpy().copy()
    with pytest.raises(ValueError, match=r"'stem\.bias': expected \(4,\) float32, got \(5,\)"):
        other.load_state_dict(partial, strict=False)
    np.testing.assert_array_equal(other.stem.weight.numpy(), kept)


def test_torch_strict_false_reports_the_same_keys() -> None:
    theirs = TorchNet()
    partial = {k: v for k, v in theirs.state_dict().items() if k.startswith("stem.")}
    partial["extra.weight"] = torch.zeros(2)
    expected = theirs.load_state_dict(partial, strict=False)
    got = Net().load_state_dict({k: v.numpy() for k, v in partial.items()}, strict=False)
    assert (got.missing_keys, got.unexpected_keys) == \
        (expected.missing_keys, expected.unexpected_keys)


@pytest.mark.parametrize("clone", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))],
                         ids=["deepcopy", "pickle"])
def test_a_copied_module_owns_its_parameters_and_their_gradients(clone) -> None:
    # A leaf's node points back at its tensor; a copy must get its own, or its
    # gradients land on the original's parameters.
    model = nn.Sequential(nn.Linear(3, 2), nn.Tanh(), nn.Linear(2, 1))
    twin = clone(model)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    pb.sum(twin(pb.tensor(x))).backward()
    assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is not None for p in twin.parameters())
    for (name, p), (_, q) in zip(model.named_parameters(), twin.named_parameters()):
        assert p is not q and q.requires_grad, name
        np.testing.assert_array_equal(p.numpy(), q.numpy())
    pb.sum(model(pb.tensor(x))).backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())


def test_copying_a_computed_tensor_is_refused_with_its_op() -> None:
    y = pb.tensor([1.0, 2.0], requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="mul"):
        copy.deepcopy(y)
