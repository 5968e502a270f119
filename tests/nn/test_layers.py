"""Every layer against PyTorch's (same weights), and backprop against autograd."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback import nn

DTYPES = {"f32": (np.float32, torch.float32, 1e-5), "f64": (np.float64, torch.float64, 1e-11)}


def _copy_into_torch(module: nn.Module, tmodule: torch.nn.Module) -> None:
    with torch.no_grad():
        for (name, p), (tname, tp) in zip(module.named_parameters(), tmodule.named_parameters()):
            assert p.shape == tuple(tp.shape), (name, tname)
            tp.copy_(torch.from_numpy(p.numpy().copy()))


def _glu_torch(in_f: int, out_f: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(in_f, 2 * out_f), torch.nn.GLU(dim=-1))


# name: (pullback module maker, torch module maker, input shape)
LAYERS = {
    "dense": (lambda d: nn.Dense(5, 3, dtype=d), lambda: torch.nn.Linear(5, 3), (4, 5)),
    "dense_batched": (lambda d: nn.Dense(5, 3, dtype=d), lambda: torch.nn.Linear(5, 3),
                      (2, 4, 5)),
    "dense_no_bias": (lambda d: nn.Dense(5, 3, bias=False, dtype=d),
                      lambda: torch.nn.Linear(5, 3, bias=False), (4, 5)),
    "conv2d": (lambda d: nn.Conv2d(2, 3, 3, stride=2, padding=1, dtype=d),
               lambda: torch.nn.Conv2d(2, 3, 3, stride=2, padding=1), (2, 2, 7, 7)),
    "glu": (lambda d: nn.GLU(5, 3, dtype=d), lambda: _glu_torch(5, 3), (4, 5)),
    "layer_norm": (lambda d: nn.LayerNorm(5, dtype=d), lambda: torch.nn.LayerNorm(5), (4, 5)),
    "relu": (lambda d: nn.ReLU(), torch.nn.ReLU, (4, 5)),
    "sigmoid": (lambda d: nn.Sigmoid(), torch.nn.Sigmoid, (4, 5)),
    "tanh": (lambda d: nn.Tanh(), torch.nn.Tanh, (4, 5)),
    "gelu": (lambda d: nn.GELU(), torch.nn.GELU, (4, 5)),
    "flatten": (lambda d: nn.Flatten(), torch.nn.Flatten, (2, 3, 4)),
    "max_pool2d": (lambda d: nn.MaxPool2d(2), lambda: torch.nn.MaxPool2d(2), (2, 3, 6, 6)),
    "sequential": (
        lambda d: nn.Sequential(nn.Dense(5, 8, dtype=d), nn.Tanh(), nn.Dense(8, 3, dtype=d)),
        lambda: torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(),
                                    torch.nn.Linear(8, 3)),
        (4, 5),
    ),
    "cnn": (
        lambda d: nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, dtype=d), nn.ReLU(),
                                nn.MaxPool2d(2), nn.Flatten(), nn.Dense(64, 10, dtype=d)),
        lambda: torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                    torch.nn.Linear(64, 10)),
        (3, 1, 8, 8),
    ),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", LAYERS)
def test_layer_forward_and_gradients_match_torch(name: str, dtype: str) -> None:
    np_dtype, torch_dtype, tol = DTYPES[dtype]
    make, make_torch, shape = LAYERS[name]
    pb.manual_seed(0)
    module = make(np_dtype)
    tmodule = make_torch().to(torch_dtype)
    _copy_into_torch(module, tmodule)
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal(shape).astype(np_dtype)
    x = pb.tensor(x0, requires_grad=True)
    xt = torch.tensor(x0, requires_grad=True)
    y, yt = module(x), tmodule(xt)
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=tol, atol=tol)
    g = rng.standard_normal(yt.shape).astype(np_dtype)
    (y * pb.tensor(g)).sum().backward()
    (yt * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=tol, atol=tol)
    for (pname, p), tp in zip(module.named_parameters(), tmodule.parameters()):
        assert p.grad.dtype == p.dtype, pname
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=tol, atol=tol,
                                   err_msg=pname)


CONTAINERS = {
    "residual": lambda: nn.Residual(nn.Sequential(nn.Dense(5, 5), nn.Tanh())),
    "lr": lambda: nn.LR(nn.Dense(5, 5), 0.5),
    "bias1d": lambda: nn.Bias1d(5),
    "nested": lambda: nn.Sequential(nn.GLU(5, 6), nn.LayerNorm(6),
                                    nn.Residual(nn.Dense(6, 6)), nn.GELU(), nn.Dense(6, 5)),
}


@pytest.mark.parametrize("name", list(LAYERS) + list(CONTAINERS))
def test_backprop_agrees_with_autograd_and_mutates_nothing(name: str) -> None:
    pb.manual_seed(0)
    if name in LAYERS:
        make, _, shape = LAYERS[name]
        module = make(np.float64)
    else:
        module, shape = CONTAINERS[name](), (4, 5)
    rng = np.random.default_rng(2)
    x0 = rng.standard_normal(shape).astype(module.parameters()[0].dtype
                                           if module.parameters() else np.float64)
    y, trace = module.traced_forward(pb.tensor(x0))
    g = rng.standard_normal(y.shape).astype(y.dtype)
    before = {n: p.numpy().copy() for n, p in module.named_parameters()}
    grad_x, grads = module.backprop(trace, pb.tensor(g))
    again_x, again = module.backprop(trace, pb.tensor(g))  # the trace is reusable
    assert all(p.grad is None for p in module.parameters())
    for n, p in module.named_parameters():
        np.testing.assert_array_equal(p.numpy(), before[n])

    x = pb.tensor(x0, requires_grad=True)
    (module(x) * pb.tensor(g)).sum().backward()
    np.testing.assert_allclose(y.numpy(), module(pb.tensor(x0)).numpy(), rtol=1e-6)
    np.testing.assert_allclose(grad_x.numpy(), x.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(grad_x.numpy(), again_x.numpy())
    flat, flat_again = nn.flatten_tree(grads), nn.flatten_tree(again)
    assert list(flat) == [n for n, _ in module.named_parameters()]
    for n, p in module.named_parameters():
        np.testing.assert_allclose(flat[n].numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=n)
        np.testing.assert_array_equal(flat[n].numpy(), flat_again[n].numpy())


def test_dense_init_is_kaiming_uniform_and_seeded() -> None:
    pb.manual_seed(3)
    a = nn.Dense(100, 50)
    pb.manual_seed(3)
    b = nn.Dense(100, 50)
    np.testing.assert_array_equal(a.weight.numpy(), b.weight.numpy())
    bound = 1 / np.sqrt(100)
    w = a.weight.numpy()
    assert w.dtype == np.float32 and np.abs(w).max() <= bound
    assert np.abs(w).max() > 0.9 * bound and abs(w.mean()) < 0.05 * bound
    assert np.abs(a.bias.numpy()).max() <= bound


def test_conv2d_init_bound_uses_the_fan_in() -> None:
    conv = nn.Conv2d(3, 8, 3)
    assert np.abs(conv.weight.numpy()).max() <= 1 / np.sqrt(27)


def test_unused_parameter_is_reported_by_backprop() -> None:
    class Half(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Parameter(pb.ones(3))
            self.unused = nn.Parameter(pb.ones(3))

        def forward(self, x):
            return x * self.used

    module = Half()
    _, trace = module.traced_forward(pb.ones(3))
    with pytest.raises(nn.NoGradientError, match=r"unused \(3,\)"):
        module.backprop(trace, pb.ones(3))


@pytest.mark.parametrize("activation, torch_gate", [
    (pb.silu, torch.nn.functional.silu), (nn.GELU(), torch.nn.functional.gelu),
    (pb.sigmoid, torch.sigmoid),
])
def test_glu_takes_its_gate_activation(activation, torch_gate) -> None:
    pb.manual_seed(0)
    module = nn.GLU(5, 3, dtype=np.float64, activation=activation)
    linear = torch.nn.Linear(5, 6).double()
    _copy_into_torch(module, linear)
    x0 = np.random.default_rng(1).standard_normal((4, 5))
    h = linear(torch.from_numpy(x0))
    expected = (h[..., :3] * torch_gate(h[..., 3:])).detach().numpy()
    np.testing.assert_allclose(module(pb.tensor(x0)).numpy(), expected, rtol=1e-12)
    # The explicit path agrees with autograd whatever the gate.
    y, trace = module.traced_forward(pb.tensor(x0))
    grad_x, grads = module.backprop(trace, pb.ones(4, 3, dtype=np.float64))
    x = pb.tensor(x0, requires_grad=True)
    module(x).sum().backward()
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(grad_x.numpy(), x.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(grads["proj"]["weight"].numpy(),
                               module.proj.weight.grad.numpy(), rtol=1e-12)


def test_glu_refuses_a_gate_that_is_not_callable() -> None:
    with pytest.raises(TypeError, match="GLU: activation must be callable"):
        nn.GLU(2, 2, activation="swish")


@pytest.mark.parametrize("wrap", [tuple, list])
def test_sequential_takes_a_tuple_or_list_of_modules(wrap) -> None:
    layers = (nn.Dense(3, 4), nn.ReLU(), nn.Dense(4, 2))
    seq = nn.Sequential(wrap(layers))
    assert len(seq) == 3 and all(a is b for a, b in zip(seq, layers))
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias", "2.weight",
                                                      "2.bias"]
    x = pb.randn(2, 3, seed=0)
    np.testing.assert_array_equal(seq(x).numpy(), nn.Sequential(*layers)(x).numpy())
