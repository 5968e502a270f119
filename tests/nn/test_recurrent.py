"""nn.LSTM and nn.GRU against torch.nn.LSTM / GRU with copied weights: outputs, final
states, input, state and parameter gradients, SGD steps, state dicts, plans, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback import nn, optim
from pullback.errors import KernelError

N, T, IN, H = 3, 4, 5, 6
TOL = {np.float32: {"rtol": 2e-5, "atol": 2e-6}, np.float64: {"rtol": 1e-11, "atol": 1e-12}}
TORCH = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}


def _twins(kind: str, dtype: type, **kwargs) -> tuple:
    """A pullback layer and its torch twin with the pullback layer's weights."""
    pb.manual_seed(0)
    kwargs.setdefault("batch_first", True)  # torch's default is False, pullback's True
    layer = getattr(nn, kind)(IN, H, dtype=dtype, **kwargs)
    twin = TORCH[kind](IN, H, **kwargs).to(torch.float64 if dtype == np.float64 else torch.float32)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            getattr(twin, name).copy_(torch.from_numpy(p.numpy().copy()))
    assert [n for n, _ in layer.named_parameters()] == [n for n, _ in twin.named_parameters()]
    return layer, twin


def _close(got: pb.Tensor, want: torch.Tensor, dtype: type, what: str) -> None:
    np.testing.assert_allclose(np.asarray(got.numpy()), want.detach().numpy(), **TOL[dtype],
                               err_msg=what)


def _states(kind: str, layers: int, rng: np.random.Generator, dtype: type, n: int = N
            ) -> list:
    count = 2 if kind == "LSTM" else 1
    return [rng.standard_normal((layers, n, H)).astype(dtype) for _ in range(count)]


CASES = [  # kind, dtype, num_layers, batch_first, given initial states
    ("LSTM", np.float64, 1, True, False),
    ("LSTM", np.float32, 2, False, True),
    ("LSTM", np.float64, 2, True, True),
    ("GRU", np.float64, 1, False, True),
    ("GRU", np.float32, 2, True, False),
    ("GRU", np.float64, 2, False, True),
]


@pytest.mark.parametrize("kind, dtype, layers, batch_first, given", CASES)
def test_matches_torch_outputs_states_and_every_gradient(kind, dtype, layers, batch_first,
                                                        given):
    _compare_with_torch(kind, dtype, layers, batch_first, given, N)


@pytest.mark.parametrize("kind, dtype, layers, batch_first, given", CASES[:2] + CASES[3:5])
def test_a_batch_split_over_the_cores_matches_torch(kind, dtype, layers, batch_first, given,
                                                   monkeypatch):
    # The per-step path (a packed-weight product and a step kernel), the batch of nine
    # in parts of four and five rows, each running every step: as torch, gradients too.
    from pullback.backend import blas, recurrent, split

    monkeypatch.setattr(blas, "_split", blas.splitting())  # what splitting notes, undone after
    monkeypatch.setattr(recurrent, "SMALL_PRODUCT", 0)
    monkeypatch.setattr(recurrent, "SPLIT_MACS", 0)
    monkeypatch.setattr(split, "parts", lambda rows: [(0, rows // 2), (rows // 2, rows)])
    _compare_with_torch(kind, dtype, layers, batch_first, given, 9)


def _compare_with_torch(kind: str, dtype: type, layers: int, batch_first: bool, given: bool,
                        n: int) -> None:
    layer, twin = _twins(kind, dtype, num_layers=layers, batch_first=batch_first)
    rng = np.random.default_rng(1)
    shape = (n, T, IN) if batch_first else (T, n, IN)
    x = rng.standard_normal(shape).astype(dtype)
    states = _states(kind, layers, rng, dtype, n) if given else None
    xs, txs = pb.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    hx = [pb.tensor(s, requires_grad=True) for s in states] if given else None
    thx = [torch.tensor(s, requires_grad=True) for s in states] if given else None
    unpack = tuple if kind == "LSTM" else lambda v: v[0]
    out, finals = layer(xs, None if hx is None else unpack(hx))
    tout, tfinals = twin(txs, None if thx is None else unpack(thx))
    finals, tfinals = (finals, tfinals) if kind == "LSTM" else ((finals,), (tfinals,))
    _close(out, tout, dtype, "output")
    for k, (got, want) in enumerate(zip(finals, tfinals, strict=True)):
        _close(got, want, dtype, f"final state {k}")
    cotangents = [rng.standard_normal(v.shape).astype(dtype) for v in (tout, *tfinals)]
    loss = sum(pb.sum(v * g) for v, g in zip((out, *finals), cotangents))
    tloss = sum((v * torch.tensor(g)).sum() for v, g in zip((tout, *tfinals), cotangents))
    loss.backward()
    tloss.backward()
    _close(xs.grad, txs.grad, dtype, "input gradient")
    for got, want in zip(hx or (), thx or (), strict=True):
        _close(got.grad, want.grad, dtype, "initial state gradient")
    for (name, p), (_, tp) in zip(layer.named_parameters(), twin.named_parameters()):
        _close(p.grad, tp.grad, dtype, f"{name} gradient")


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_without_bias_and_unbatched_input_match_torch(kind):
    layer, twin = _twins(kind, np.float64, bias=False, num_layers=2)
    x = np.random.default_rng(2).standard_normal((T, IN))
    out, finals = layer(pb.tensor(x))
    tout, tfinals = twin(torch.from_numpy(x))
    _close(out, tout, np.float64, "output")
    assert out.shape == (T, H)
    finals, tfinals = (finals, tfinals) if kind == "LSTM" else ((finals,), (tfinals,))
    for got, want in zip(finals, tfinals, strict=True):
        assert got.shape == (2, H)
        _close(got, want, np.float64, "final state")


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_sgd_steps_follow_torch(kind):
    layer, twin = _twins(kind, np.float32, num_layers=2)
    opt = optim.SGD(layer.parameters(), 0.1)
    topt = torch.optim.SGD(twin.parameters(), 0.1)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = rng.standard_normal((N, T, IN)).astype(np.float32)
        target = rng.standard_normal((N, T, H)).astype(np.float32)
        opt.zero_grad()
        out = layer(pb.tensor(x))[0]
        pb.mean((out - target) * (out - target)).backward()
        opt.step()
        topt.zero_grad()
        tout = twin(torch.from_numpy(x))[0]
        ((tout - torch.from_numpy(target)) ** 2).mean().backward()
        topt.step()
    for (name, p), (_, tp) in zip(layer.named_parameters(), twin.named_parameters()):
        _close(p, tp, np.float32, f"{name} after 3 steps")


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_a_torch_state_dict_loads_unchanged(kind):
    torch.manual_seed(0)
    twin = TORCH[kind](IN, H, num_layers=2, batch_first=True)
    layer = getattr(nn, kind)(IN, H, num_layers=2)
    layer.load_state_dict({k: v.numpy() for k, v in twin.state_dict().items()})
    x = np.random.default_rng(4).standard_normal((N, T, IN)).astype(np.float32)
    _close(layer(pb.tensor(x))[0], twin(torch.from_numpy(x))[0], np.float32, "output")


def test_init_is_uniform_within_one_over_sqrt_hidden_size():
    pb.manual_seed(0)
    layer = nn.LSTM(IN, 100, num_layers=2)
    assert len(layer.parameters()) == 8
    values = np.concatenate([p.numpy().ravel() for p in layer.parameters()])
    assert np.abs(values).max() <= 0.1 and np.abs(values).max() > 0.099
    assert layer.weight_ih_l1.shape == (400, 100) and layer.bias_hh_l1.shape == (400,)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_training_plan_matches_eager(kind):
    pb.manual_seed(0)
    layer = getattr(nn, kind)(IN, H, num_layers=2)
    head = nn.Dense(H, 4)
    x = np.random.default_rng(5).standard_normal((N, T, IN)).astype(np.float32)
    labels = np.arange(N) % 4

    def loss_fn(x, y):
        out = layer(x)[0]
        return nn.cross_entropy(head(out[:, -1]), y)

    params = layer.parameters() + head.parameters()
    step = pb.compile(loss_fn, x, labels, mode=pb.LoweringMode.TRAINING)
    loss = step(x, labels)
    planned = [p.grad.numpy().copy() for p in params]
    for p in params:
        p.grad = None
    eager = loss_fn(pb.tensor(x), labels)
    eager.backward()
    np.testing.assert_allclose(loss.numpy(), eager.numpy(), rtol=1e-6)
    for got, p in zip(planned, params):
        np.testing.assert_allclose(got, p.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_wrong_input_size_names_the_layer_and_shapes():
    layer = nn.LSTM(IN, H)
    with pytest.raises(KernelError, match=r"^LSTM: \(3, 4, 7\): input has 7 features in its "
                       r"last axis but input_size is 5"):
        layer(np.zeros((N, T, 7), np.float32))
    with pytest.raises(KernelError, match=r"^GRU: .*expected a 3-D input \(N, T, input_size\)"):
        nn.GRU(IN, H)(np.zeros((1, N, T, IN), np.float32))


def test_wrong_initial_states_are_refused_with_their_shapes():
    x = np.zeros((N, T, IN), np.float32)
    h = np.zeros((1, N + 1, H), np.float32)
    with pytest.raises(KernelError, match=r"^GRU: \(4, 3, 5\) and \(1, 4, 6\): hx must have "
                       r"shape \(num_layers, N, hidden_size\) = \(1, 3, 6\)"):
        nn.GRU(IN, H)(x, h)
    with pytest.raises(KernelError, match=r"^LSTM: .*c_0 must have shape"):
        nn.LSTM(IN, H)(x, (np.zeros((1, N, H), np.float32), h))
    with pytest.raises(KernelError, match=r"^LSTM: .*share one dtype"):
        nn.LSTM(IN, H)(x.astype(np.float64))
