"""PyTorch's names for layers: Linear (Dense), Identity, SiLU, Softmax, LogSoftmax and
ModuleDict against their torch twins, with copied weights and torch state dicts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback import nn, optim

TOL = {np.float32: 1e-5, np.float64: 1e-11}


def torch_state(tmodule: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in tmodule.state_dict().items()}


def test_linear_is_dense_with_torch_layout() -> None:
    assert nn.Linear is nn.Dense
    layer, tlayer = nn.Linear(in_features=5, out_features=3, bias=True), torch.nn.Linear(5, 3)
    assert {k: v.shape for k, v in layer.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in tlayer.state_dict().items()}
    assert list(nn.Linear(5, 3, bias=False).state_dict()) == \
        list(torch.nn.Linear(5, 3, bias=False).state_dict())


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_linear_loads_a_torch_state_dict_and_trains_as_torch(dtype: type) -> None:
    torch.manual_seed(0)
    tmodel = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.SiLU(),
                                 torch.nn.Linear(6, 3), torch.nn.LogSoftmax(dim=-1))
    tmodel = tmodel.to(torch.float64 if dtype == np.float64 else torch.float32)
    model = nn.Sequential(nn.Linear(4, 6, dtype=dtype), nn.SiLU(), nn.Linear(6, 3, dtype=dtype),
                          nn.LogSoftmax(dim=-1))
    model.load_state_dict(torch_state(tmodel))
    opt = optim.SGD(model.parameters(), 0.1, momentum=0.9)
    topt = torch.optim.SGD(tmodel.parameters(), 0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x0 = rng.standard_normal((5, 4)).astype(dtype)
        x, xt = pb.tensor(x0, requires_grad=True), torch.tensor(x0, requires_grad=True)
        y, yt = model(x), tmodel(xt)
        np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=TOL[dtype],
                                   atol=TOL[dtype])
        opt.zero_grad()
        topt.zero_grad()
        (y * y).sum().backward()
        (yt * yt).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=TOL[dtype],
                                   atol=TOL[dtype])
        for (name, p), tp in zip(model.named_parameters(), tmodel.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=TOL[dtype],
                                       atol=TOL[dtype], err_msg=name)
        opt.step()
        topt.step()
    for (name, p), tp in zip(model.named_parameters(), tmodel.parameters()):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=TOL[dtype] * 10,
                                   atol=TOL[dtype], err_msg=name)


@pytest.mark.parametrize(("ours", "theirs"), [
    (nn.Identity(7, unused=True), torch.nn.Identity(7, unused=True)),
    (nn.SiLU(), torch.nn.SiLU()),
    (nn.Softmax(dim=1), torch.nn.Softmax(dim=1)),
    (nn.Softmax(0), torch.nn.Softmax(0)),
    (nn.LogSoftmax(dim=1), torch.nn.LogSoftmax(dim=1)),
], ids=["identity", "silu", "softmax1", "softmax0", "log_softmax"])
def test_parameterless_layers_match_torch(ours: nn.Module, theirs: torch.nn.Module) -> None:
    x0 = np.random.default_rng(1).standard_normal((3, 4, 2))
    g = np.random.default_rng(2).standard_normal((3, 4, 2))
    x, xt = pb.tensor(x0, requires_grad=True), torch.tensor(x0, requires_grad=True)
    y, yt = ours(x), theirs(xt)
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-12, atol=1e-14)
    (y * pb.tensor(g)).sum().backward()
    (yt * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_softmax_needs_its_dim() -> None:
    with pytest.raises(TypeError):
        nn.Softmax()  # type: ignore[call-arg]
    assert repr(nn.Softmax(dim=-1)) == "Softmax(dim=-1)"


def make_dicts() -> tuple[nn.ModuleDict, torch.nn.ModuleDict]:
    ours = nn.ModuleDict({"enc": nn.Linear(3, 4), "act": nn.SiLU()})
    ours["dec"] = nn.Sequential(nn.Linear(4, 2), nn.Identity())
    theirs = torch.nn.ModuleDict({"enc": torch.nn.Linear(3, 4), "act": torch.nn.SiLU()})
    theirs["dec"] = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Identity())
    return ours, theirs


def test_module_dict_names_and_loads_state_as_torch() -> None:
    ours, theirs = make_dicts()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    ours.load_state_dict(torch_state(theirs))
    x0 = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    y = ours["dec"](ours["act"](ours["enc"](pb.tensor(x0))))
    yt = theirs["dec"](theirs["act"](theirs["enc"](torch.tensor(x0))))
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_module_dict_acts_as_a_dict_of_registered_children() -> None:
    ours, _ = make_dicts()
    assert len(ours) == 3 and list(ours) == ["enc", "act", "dec"] and "act" in ours
    assert list(ours.keys()) == ["enc", "act", "dec"]
    assert [type(m).__name__ for m in ours.values()] == ["Dense", "SiLU", "Sequential"]
    assert [k for k, _ in ours.items()] == list(ours)
    assert ours.pop("act").__class__ is nn.SiLU and "act" not in ours
    del ours["enc"]
    assert list(ours.state_dict()) == ["dec.0.weight", "dec.0.bias"]
    ours.update([("head", nn.Linear(2, 1))])
    assert len(ours.parameters()) == 4 and ours.head is ours["head"]
    ours.clear()
    assert len(ours) == 0 and ours.parameters() == []
    with pytest.raises(KeyError, match="no module named 'nope'"):
        ours["nope"]
    with pytest.raises(KeyError, match="would hide the attribute"):
        ours["training"] = nn.Identity()
    with pytest.raises(KeyError, match=r"without '\.'"):
        ours["a.b"] = nn.Identity()
    with pytest.raises(TypeError, match="must be a Module"):
        ours["x"] = 3  # type: ignore[assignment]
