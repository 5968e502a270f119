"""`Tensor.backward`: rule 5 (a missing backward is an error naming op and parameter),
deep chains, accumulation and retain_graph, create_graph against torch's double
backward, and the errors of a malformed call."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback.ad import DerivativeError
from pullback.ops import declare


def _no_grad_op():
    return declare(
        "no_grad_op", lambda backend, x: x * 2.0, lambda x: (x.shape, x.dtype), register=False
    )


# ---------------------------------------------------------------- rule 5

DIFFERENTIATE = {
    "backward": lambda f, t: f(t).backward(),
    "grad": lambda f, t: pb.grad(f)(t),
    "value_and_grad": lambda f, t: pb.value_and_grad(f)(t),
    "vjp": lambda f, t: pb.vjp(f, t)[1](np.ones((), t.dtype)),
    "jvp": lambda f, t: pb.jvp(f, (t,), (pb.ones_like(t),)),
}


@pytest.mark.parametrize("how", list(DIFFERENTIATE))
def test_op_without_backward_on_the_path_raises_naming_op_and_parameter(how) -> None:
    op = _no_grad_op()
    param = pb.tensor(np.ones((2, 3)), requires_grad=how == "backward")
    with pytest.raises(DerivativeError) as info:
        DIFFERENTIATE[how](lambda t: (op.bind(t) * t).sum(), param)
    message = str(info.value)
    assert "no_grad_op" in message
    assert "(2, 3)" in message


def test_op_without_backward_off_the_path_is_not_an_error() -> None:
    op = _no_grad_op()
    param = pb.tensor(np.ones((2, 3)), requires_grad=True)
    (op.bind(param.detach()) * param).sum().backward()
    np.testing.assert_array_equal(param.grad.numpy(), np.full((2, 3), 2.0))


# ---------------------------------------------------------------- deep chains

STEPS = 10_000


@pytest.mark.parametrize("how", ["backward", "grad"])
def test_ten_thousand_op_chain_has_the_right_gradient(how) -> None:
    def chain(x):
        for _ in range(STEPS):
            x = x * 1.0001
        return x.sum()

    x = pb.tensor([1.5], dtype=pb.float64, requires_grad=True)
    if how == "backward":
        chain(x).backward()
        got = x.grad
    else:
        got = pb.grad(chain)(x)
    np.testing.assert_allclose(got.numpy(), [1.0001**STEPS], rtol=1e-10)


# ---------------------------------------------------------------- accumulation


def _square_sum(x):
    return (x * x).sum()


def test_second_backward_without_retain_graph_raises_a_clear_error() -> None:
    x = pb.tensor([1.0, 2.0], requires_grad=True)
    y = _square_sum(x)
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])  # unchanged by the failure


def test_second_backward_with_retain_graph_accumulates() -> None:
    x = pb.tensor([1.0, 2.0], requires_grad=True)
    y = _square_sum(x)
    y.backward(retain_graph=True)
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 8.0])


def test_two_forward_passes_accumulate_into_grad() -> None:
    x = pb.tensor([1.0, 2.0], requires_grad=True)
    _square_sum(x).backward()
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [5.0, 7.0])


def test_grad_buffer_is_owned_not_shared_with_a_cotangent() -> None:
    x = pb.tensor([1.0, 2.0], requires_grad=True)
    w = pb.tensor([1.0, 2.0], requires_grad=True)
    (x + w).sum().backward()
    first = x.grad.numpy().copy()
    (x + w).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * first)
    np.testing.assert_array_equal(w.grad.numpy(), 2 * first)


def test_backward_with_explicit_grad_is_a_vector_jacobian_product() -> None:
    a = np.array([0.5, -1.0, 2.0])
    v = np.array([1.0, 0.5, -2.0])
    x = pb.tensor(a, requires_grad=True)
    pb.tanh(x).backward(pb.tensor(v))
    np.testing.assert_allclose(x.grad.numpy(), v * (1 - np.tanh(a) ** 2))


# ---------------------------------------------------------------- create_graph

SECOND_ORDER = {
    "cube": (lambda x: (x**3).sum(), lambda x: (x**3).sum()),
    "tanh": (lambda x: pb.tanh(x).sum(), lambda x: torch.tanh(x).sum()),
    "softmax": (
        lambda x: (pb.softmax(x) * pb.tensor([1.0, -2.0, 0.5], dtype=pb.float64)).sum(),
        lambda x: (torch.softmax(x, -1) * torch.tensor([1.0, -2.0, 0.5])).sum(),
    ),
    "log_softmax": (
        lambda x: (pb.log_softmax(x) * pb.tensor([1.0, -2.0, 0.5], dtype=pb.float64)).sum(),
        lambda x: (torch.log_softmax(x, -1) * torch.tensor([1.0, -2.0, 0.5])).sum(),
    ),
    "sigmoid_times_x": (
        lambda x: (pb.sigmoid(x) * x).sum(), lambda x: (torch.sigmoid(x) * x).sum()
    ),
    "exp_over_x": (lambda x: (pb.exp(x) / x).sum(), lambda x: (torch.exp(x) / x).sum()),
}
X0 = np.array([0.3, -1.2, 0.7])


def _torch_first_and_second(f_torch, x0):
    xt = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(f_torch(xt), xt, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), xt)
    return g.detach().numpy(), h.numpy()


@pytest.mark.parametrize("name", list(SECOND_ORDER))
def test_create_graph_second_derivative_matches_torch(name) -> None:
    f_pb, f_torch = SECOND_ORDER[name]
    x = pb.tensor(X0, requires_grad=True)
    f_pb(x).backward(create_graph=True)
    g = x.grad
    assert g.requires_grad
    x.grad = None
    g.sum().backward()
    g_ref, h_ref = _torch_first_and_second(f_torch, X0)
    np.testing.assert_allclose(g.numpy(), g_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), h_ref, rtol=1e-10, atol=1e-12)


def test_create_graph_second_backward_accumulates_like_torch() -> None:
    x = pb.tensor(X0, requires_grad=True)
    (x**3).sum().backward(create_graph=True)
    x.grad.sum().backward()  # x.grad = 3x^2 + 6x, as in PyTorch
    np.testing.assert_allclose(x.grad.numpy(), 3 * X0**2 + 6 * X0)


def test_backward_without_create_graph_gives_a_plain_gradient() -> None:
    x = pb.tensor(X0, requires_grad=True)
    (x**3).sum().backward()
    assert not x.grad.requires_grad


# ---------------------------------------------------------------- malformed calls


def test_backward_with_a_wrong_shaped_grad_names_both_shapes() -> None:
    y = pb.tensor([1.0, 2.0], requires_grad=True) * 2.0
    with pytest.raises(ValueError, match=r"\(3,\).*\(2,\)"):
        y.backward(pb.ones(3))


def test_backward_on_a_tensor_that_does_not_require_grad_raises() -> None:
    with pytest.raises(RuntimeError, match="does not require grad"):
        (pb.tensor([1.0, 2.0]) * 2.0).sum().backward()


def test_backward_without_grad_on_a_non_scalar_raises() -> None:
    y = pb.tensor([1.0, 2.0], requires_grad=True) * 2.0
    with pytest.raises(RuntimeError, match=r"\(2,\)"):
        y.backward()
