"""The explicit loop `traced_forward; backprop; update` with the trace still alive,
for modules traced through the recorded graph."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import nn, optim
from pullback.backend import Backend, CpuBackend

# CpuBackend's forward ops alone: a backend without backward kernels.
_FORWARD_OPS = {name: vars(CpuBackend)[name] for name, value in vars(Backend).items()
                if callable(value) and not name.startswith("_")}
ForwardOnly = type("ForwardOnly", (Backend,), {**_FORWARD_OPS, "name": "forward-only"})


class Scaled(nn.Module):
    """A user module: its forward records a graph that saves its parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(pb.randn(4, 3, seed=3, dtype=np.float64))
        self.s = nn.Parameter(pb.ones(3, dtype=np.float64))

    def forward(self, x):
        return pb.tanh(x @ self.w) * self.s


def _layer_norm() -> nn.Module:
    return nn.LayerNorm(4, dtype=np.float64)


def _conv() -> nn.Module:
    return nn.Conv2d(2, 3, 3, padding=1, dtype=np.float64)


CASES = {"layer_norm": (_layer_norm, (5, 4)), "user_module": (Scaled, (5, 4)),
         "conv2d_forward_only_backend": (_conv, (2, 2, 5, 5))}


@pytest.mark.parametrize("name", CASES)
def test_update_works_while_the_trace_is_alive(name: str) -> None:
    make, shape = CASES[name]
    pb.manual_seed(0)
    a, b = make(), make()
    b.load_state_dict(a.state_dict())
    x = pb.randn(*shape, seed=1, dtype=np.float64)
    with pb.use_backend(ForwardOnly() if name.startswith("conv") else pb.get_backend()):
        y, trace = a.traced_forward(x)
        g = pb.randn(*y.shape, seed=2, dtype=np.float64)
        _, grads = a.backprop(trace, g)
        arrays = [p._data for p in a.parameters()]
        a.update(optim.SGD(a.parameters(), 0.1), grads)  # raised: a pending backward...
        # The parameters kept their arrays, and the trace its values: a second backprop
        # after the update gives the same gradients as the first.
        assert all(p._data is arr for p, arr in zip(a.parameters(), arrays))
        _, again = a.backprop(trace, g)
        for key, value in nn.flatten_tree(grads).items():
            np.testing.assert_array_equal(nn.flatten_tree(again)[key].numpy(), value.numpy())
        # The same step through autograd.
        opt = optim.SGD(b.parameters(), 0.1)
        (b(x) * g).sum().backward()
        opt.step()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-12, err_msg=n)


def test_the_trace_still_guards_the_input_it_saved() -> None:
    x = pb.randn(5, 4, seed=1)
    _, trace = nn.LayerNorm(4).traced_forward(x)
    with pytest.raises(RuntimeError, match="pending backward of layer_norm"):
        x.add_(1.0)
    del trace


def test_a_trainable_onnx_model_updates_while_its_trace_is_alive(tmp_path) -> None:
    import pullback.onnx

    pb.manual_seed(0)
    source = nn.Sequential(nn.Dense(4, 3), nn.LayerNorm(3), nn.Tanh())
    path = tmp_path / "model.onnx"
    pullback.onnx.export(source, pb.randn(2, 4, seed=0), str(path))
    model = pullback.onnx.load(str(path), trainable=True)
    before = [p.numpy().copy() for p in model.parameters()]
    y, trace = model.traced_forward(pb.randn(2, 4, seed=1))
    y = y[0] if isinstance(y, tuple) else y
    _, grads = model.backprop(trace, pb.ones(*y.shape))
    model.update(optim.SGD(model.parameters(), 0.1), grads)  # raised: pending backward...
    flat = list(nn.flatten_tree(grads).values())
    for p, b, g in zip(model.parameters(), before, flat):
        np.testing.assert_allclose(p.numpy(), b - 0.1 * g.numpy(), rtol=1e-6, atol=1e-7)


def test_traced_output_is_a_value_so_a_loss_on_it_is_first_order() -> None:
    # The trace keeps the recorded graph; the output is cut from it, so a loss's vjp on
    # it takes the fused first-order path instead of recording its own backward.
    model = nn.Sequential(nn.Dense(4, 3, dtype=np.float64), nn.ReLU())
    logits, trace = model.traced_forward(pb.randn(5, 4, seed=1, dtype=np.float64))
    assert logits._node is None and not logits.requires_grad
    labels = pb.tensor(np.array([0, 1, 2, 0, 1]))
    loss, vjp_fn = pb.vjp(lambda z: nn.cross_entropy(z, labels), logits)
    (grad_logits,) = vjp_fn(pb.ones_like(loss))
    assert grad_logits._node is None
    _, grads = model.backprop(trace, grad_logits)
    eager_loss = nn.cross_entropy(model(pb.tensor(trace.input._data)), labels)
    eager_loss.backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(nn.module.flatten_tree(grads)[name].numpy(), p.grad.numpy(),
                                   rtol=1e-12)
