"""0-d tensors through every way of differentiating: a gradient that accumulates stays a
0-d array (NumPy's operators collapse 0-d results to scalars), and max over a 0-d tensor
has PyTorch's derivative, 1, through backward, `pb.grad`, TRAINING plans and grad-of-grad."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb

TRAINING = pb.LoweringMode.TRAINING


def _scalar(value: float, requires_grad: bool = False) -> pb.Tensor:
    return pb.tensor(np.array(value), dtype=pb.float64, requires_grad=requires_grad)


def _assert_zero_dim_array(grad: pb.Tensor, want: float) -> None:
    array = np.asarray(grad)  # raised "object __array__ method not producing an array"
    assert type(array) is np.ndarray and array.shape == () and array.dtype == np.float64
    assert type(grad.numpy()) is np.ndarray
    np.testing.assert_allclose(array, want, rtol=1e-12)


# ---------------------------------------------------------------- accumulation


def test_zero_dim_grad_stays_an_array_after_a_second_backward() -> None:
    x = _scalar(0.5, requires_grad=True)
    (x * 3.0).backward()
    (x * 3.0).backward()
    _assert_zero_dim_array(x.grad, 6.0)


def test_zero_dim_grad_stays_an_array_after_create_graph_then_backward() -> None:
    x = _scalar(0.5, requires_grad=True)
    (x * x).backward(create_graph=True)
    (x * 3.0).backward()
    _assert_zero_dim_array(x.grad, 2 * 0.5 + 3.0)


def test_zero_dim_grad_stays_an_array_after_two_create_graph_backwards() -> None:
    x = _scalar(0.5, requires_grad=True)
    (x * x).backward(create_graph=True)
    (x * x * x).backward(create_graph=True)
    _assert_zero_dim_array(x.grad, 2 * 0.5 + 3 * 0.25)


def test_zero_dim_grad_stays_an_array_after_a_second_training_plan_call() -> None:
    w = _scalar(0.5, requires_grad=True)
    step = pb.compile(lambda a: (a * w * 3.0).sum(), _scalar(2.0), mode=TRAINING)
    step(_scalar(2.0))
    step(_scalar(2.0))
    _assert_zero_dim_array(w.grad, 12.0)


# ---------------------------------------------------------------- max of a 0-d tensor


def _torch_max_derivatives(value: float, keepdims: bool) -> tuple[float, float]:
    """d/dx and d2/dx2 of max(x) * max(x) * x at `value`, by PyTorch."""
    x = torch.tensor(value, dtype=torch.float64, requires_grad=True)
    m = x.amax(dim=(), keepdim=keepdims) if keepdims else x.amax()
    (first,) = torch.autograd.grad(m * m * x, x, create_graph=True)
    (second,) = torch.autograd.grad(first, x)
    return first.item(), second.item()


def _cubed(keepdims: bool):
    def f(x: pb.Tensor) -> pb.Tensor:
        m = pb.max(x, keepdims=keepdims)
        return m * m * x
    return f


@pytest.mark.parametrize("keepdims", [False, True])
def test_max_of_zero_dim_tensor_has_gradient_one(keepdims: bool) -> None:
    x = _scalar(0.7)
    grad = pb.grad(lambda t: pb.max(t, keepdims=keepdims))(x)
    _assert_zero_dim_array(grad, 1.0)
    y = _scalar(0.7, requires_grad=True)
    pb.max(y, keepdims=keepdims).backward()
    _assert_zero_dim_array(y.grad, 1.0)
    (ct,) = pb.vjp(lambda t: pb.max(t, keepdims=keepdims), x)[1](np.array(2.0))
    _assert_zero_dim_array(ct, 2.0)


@pytest.mark.parametrize("keepdims", [False, True])
def test_max_of_zero_dim_tensor_matches_torch_to_second_order(keepdims: bool) -> None:
    first, second = _torch_max_derivatives(0.7, keepdims)
    f = _cubed(keepdims)
    _assert_zero_dim_array(pb.grad(f)(_scalar(0.7)), first)
    _assert_zero_dim_array(pb.grad(pb.grad(f))(_scalar(0.7)), second)
    y = _scalar(0.7, requires_grad=True)
    (g,) = pb.vjp(f, y)[1](np.array(1.0))
    assert isinstance(g, pb.Tensor)
    f(y).backward(create_graph=True)
    y.grad.backward()  # accumulates d2 onto d1 in y.grad
    _assert_zero_dim_array(y.grad, first + second)


@pytest.mark.parametrize("keepdims", [False, True])
def test_max_of_zero_dim_tensor_in_a_training_plan(keepdims: bool) -> None:
    first, _ = _torch_max_derivatives(0.7, keepdims)
    w = _scalar(0.7, requires_grad=True)
    step = pb.compile(lambda a: _cubed(keepdims)(w * a).sum(), _scalar(1.0), mode=TRAINING)
    loss = step(_scalar(1.0))
    np.testing.assert_allclose(np.asarray(loss), 0.7 ** 3, rtol=1e-12)
    _assert_zero_dim_array(w.grad, first)
    step(_scalar(1.0))
    _assert_zero_dim_array(w.grad, 2 * first)


def test_zero_dim_grad_inside_grad_stays_an_array_where_cotangents_meet() -> None:
    """Under an outer transform the inner backward records; two constant cotangents meeting
    at one node (y + y) were added with NumPy's `+` and gave a NumPy scalar."""
    seen = []

    def outer(z: pb.Tensor) -> pb.Tensor:
        inner = pb.grad(lambda y: y + y)(z)
        seen.append(inner)
        return inner * z * z

    _assert_zero_dim_array(pb.grad(outer)(_scalar(0.5)), 2.0 * 2 * 0.5)
    _assert_zero_dim_array(seen[0], 2.0)


# ---------------------------------------------------------------- axis 0 of a 0-d tensor

AXIS_OPS = {
    "sum": (pb.sum, torch.sum),
    "mean": (pb.mean, torch.mean),
    "max": (pb.max, lambda x, dim: torch.amax(x, dim)),
    "softmax": (pb.softmax, torch.softmax),
    "log_softmax": (pb.log_softmax, torch.log_softmax),
}


@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("name", AXIS_OPS)
def test_a_zero_dim_tensor_takes_axis_0_and_minus_1_as_torch_does(name: str, axis: int) -> None:
    # PyTorch reads dim 0 (or -1) of a 0-d tensor as the tensor itself; pullback raised
    # "axes (0,) are out of range" (sum, max) or "axis -1 is out of range" (softmax).
    pb_fn, torch_fn = AXIS_OPS[name]
    x = _scalar(0.7, requires_grad=True)
    xt = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    y, yt = pb_fn(x, axis), torch_fn(xt, axis)
    assert y.shape == tuple(yt.shape)
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-12)
    (y * 3.0).backward()
    (yt * 3.0).backward()
    _assert_zero_dim_array(x.grad, float(xt.grad))


@pytest.mark.parametrize("name", AXIS_OPS)
def test_a_zero_dim_tensor_refuses_axis_1_naming_the_op(name: str) -> None:
    with pytest.raises(pb.KernelError, match=rf"^{name}: .*axis 1 is out of range for 0 dim"):
        AXIS_OPS[name][0](_scalar(0.7), 1)
