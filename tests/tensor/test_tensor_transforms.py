"""Transforms against torch and against their own algebra: grad, value_and_grad, vjp,
jvp, linearize (linear, equal to jvp), linear_transpose (the matrix transpose, the
adjoint identity), nesting, and `no_grad`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import jvp as torch_jvp

import pullback as pb

RNG = np.random.default_rng(7)
A = RNG.standard_normal(4)
B = RNG.standard_normal(4)
T = RNG.standard_normal(4)
W = RNG.standard_normal((4, 3))
C = np.array([0.5, -1.0, 2.0, 0.25])


def _t(x) -> pb.Tensor:
    return pb.tensor(np.asarray(x, dtype=np.float64))


def _torch(x) -> torch.Tensor:
    return torch.tensor(np.asarray(x, dtype=np.float64))


def _close(got, expected, tol: float = 1e-10) -> None:
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=tol, atol=tol)


# Scalar functions of one vector: (pullback, torch). Inputs are positive where log needs it.
SCALAR_FNS = {
    "tanh_times_x": (lambda x: (pb.tanh(x) * x).sum(), lambda x: (torch.tanh(x) * x).sum()),
    "cube": (lambda x: (x**3).sum(), lambda x: (x**3).sum()),
    "exp_sin_free": (lambda x: pb.exp(x * 0.5).mean(), lambda x: torch.exp(x * 0.5).mean()),
    "softmax_dot": (
        lambda x: (pb.softmax(x) * _t(C)).sum(), lambda x: (torch.softmax(x, -1) * _torch(C)).sum()
    ),
    "log_softmax_dot": (
        lambda x: (pb.log_softmax(x) * _t(C)).sum(),
        lambda x: (torch.log_softmax(x, -1) * _torch(C)).sum(),
    ),
    "matmul_tanh": (
        lambda x: pb.tanh(x @ _t(W)).sum(), lambda x: torch.tanh(x @ _torch(W)).sum()
    ),
    "sigmoid_silu": (
        lambda x: (pb.sigmoid(x) + pb.silu(x)).sum(),
        lambda x: (torch.sigmoid(x) + F.silu(x)).sum(),
    ),
    "gelu": (lambda x: pb.gelu(x).sum(), lambda x: F.gelu(x).sum()),
    "softplus_sq": (lambda x: (pb.softplus(x) ** 2).sum(), lambda x: (F.softplus(x) ** 2).sum()),
    "log_sqrt_positive": (
        lambda x: (pb.log(x * x + 1.0) + pb.sqrt(x * x + 2.0)).sum(),
        lambda x: (torch.log(x * x + 1.0) + torch.sqrt(x * x + 2.0)).sum(),
    ),
    "div": (lambda x: (1.0 / (x * x + 1.0)).sum(), lambda x: (1.0 / (x * x + 1.0)).sum()),
}
SCALAR_IDS = list(SCALAR_FNS)


def _torch_grad(f, x0, create_graph=False):
    x = _torch(x0).requires_grad_()
    (g,) = torch.autograd.grad(f(x), x, create_graph=create_graph)
    return g, x


# ---------------------------------------------------------------- reverse mode


@pytest.mark.parametrize("name", SCALAR_IDS)
def test_grad_matches_torch(name) -> None:
    f_pb, f_torch = SCALAR_FNS[name]
    g = pb.grad(f_pb)(_t(A))
    assert g.shape == (4,) and g.dtype == pb.float64
    _close(g, _torch_grad(f_torch, A)[0].numpy())


@pytest.mark.parametrize("name", SCALAR_IDS)
def test_grad_of_grad_matches_torch(name) -> None:
    f_pb, f_torch = SCALAR_FNS[name]
    h = pb.grad(lambda x: pb.grad(f_pb)(x).sum())(_t(A))
    g, x = _torch_grad(f_torch, A, create_graph=True)
    (h_ref,) = torch.autograd.grad(g.sum(), x)
    _close(h, h_ref.numpy(), 1e-9)


def test_grad_with_tuple_argnums_returns_a_tuple() -> None:
    def f(x, y, scale):
        return (pb.tanh(x) * y).sum() * scale

    gx, gy = pb.grad(f, argnums=(0, 1))(_t(A), _t(B), 2.0)
    x, y = _torch(A).requires_grad_(), _torch(B).requires_grad_()
    ref = torch.autograd.grad((torch.tanh(x) * y).sum() * 2.0, (x, y))
    _close(gx, ref[0].numpy())
    _close(gy, ref[1].numpy())
    (only_y,) = pb.grad(f, argnums=(1,))(_t(A), _t(B), 2.0)
    _close(only_y, ref[1].numpy())


def test_value_and_grad_returns_the_value_and_the_gradient() -> None:
    value, g = pb.value_and_grad(lambda x, y: (x * y).sum(), argnums=1)(_t(A), _t(B))
    _close(value.item(), float(A @ B))
    _close(g, A)


def test_vjp_with_several_primals_and_a_tuple_output_matches_torch() -> None:
    def f_pb(x, w):
        return pb.tanh(x @ w), (x * x).sum()

    out, vjp_fn = pb.vjp(f_pb, _t(A), _t(W))
    ct = (RNG.standard_normal(3), np.float64(1.5))
    gx, gw = vjp_fn((_t(ct[0]), _t(ct[1])))
    x, w = _torch(A).requires_grad_(), _torch(W).requires_grad_()
    out_ref = (torch.tanh(x @ w), (x * x).sum())
    ref = torch.autograd.grad(out_ref, (x, w), (_torch(ct[0]), _torch(ct[1])))
    _close(out[0], out_ref[0].detach().numpy())
    _close(out[1], out_ref[1].detach().numpy())
    assert gx.shape == (4,) and gw.shape == (4, 3)
    _close(gx, ref[0].numpy())
    _close(gw, ref[1].numpy())
    # The vjp function can be called again, with another cotangent.
    gx2, _ = vjp_fn((_t(2 * ct[0]), _t(2 * ct[1])))
    _close(gx2, 2 * ref[0].numpy())


def test_grad_of_an_input_the_output_ignores_is_zeros() -> None:
    gx, gy = pb.grad(lambda x, y: (y * y).sum(), argnums=(0, 1))(
        pb.tensor(np.ones((2, 3), np.float32)), _t(B)
    )
    assert gx.shape == (2, 3) and gx.dtype == pb.float32
    np.testing.assert_array_equal(gx.numpy(), np.zeros((2, 3)))
    _close(gy, 2 * B)


def test_grad_of_a_non_scalar_output_raises() -> None:
    with pytest.raises(TypeError, match=r"one-element.*\(4,\)"):
        pb.grad(lambda x: x * 2.0)(_t(A))


def test_grad_with_respect_to_an_integer_input_raises_type_error() -> None:
    with pytest.raises(TypeError, match="int64"):
        pb.grad(lambda x: (x * 2.0).sum())(pb.tensor([1, 2]))


# ---------------------------------------------------------------- forward mode

VECTOR_FNS = {
    "tanh_times_x": (lambda x: pb.tanh(x) * x, lambda x: torch.tanh(x) * x),
    "softmax": (lambda x: pb.softmax(x), lambda x: torch.softmax(x, -1)),
    "matmul_exp": (lambda x: pb.exp(x @ _t(W)), lambda x: torch.exp(x @ _torch(W))),
    "max_and_abs_pow": (
        lambda x: pb.max(x) + pb.abs(x) ** 1.5, lambda x: torch.max(x) + torch.abs(x) ** 1.5
    ),
    "gelu_tanh": (
        lambda x: pb.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")
    ),
}
VECTOR_IDS = list(VECTOR_FNS)


@pytest.mark.parametrize("name", VECTOR_IDS)
def test_jvp_matches_torch_func_jvp(name) -> None:
    f_pb, f_torch = VECTOR_FNS[name]
    out, tangent_out = pb.jvp(f_pb, (_t(A),), (_t(T),))
    out_ref, tangent_ref = torch_jvp(f_torch, (_torch(A),), (_torch(T),))
    _close(out, out_ref.numpy())
    _close(tangent_out, tangent_ref.numpy())


def test_jvp_with_several_primals_and_a_tuple_output_matches_torch() -> None:
    out, tangents = pb.jvp(
        lambda x, y: (x * y, pb.exp(x)), (_t(A), _t(B)), (_t(T), _t(C))
    )
    out_ref, tangents_ref = torch_jvp(
        lambda x, y: (x * y, torch.exp(x)), (_torch(A), _torch(B)), (_torch(T), _torch(C))
    )
    for got, ref in zip((*out, *tangents), (*out_ref, *tangents_ref), strict=True):
        _close(got, ref.numpy())


@pytest.mark.parametrize("name", VECTOR_IDS)
def test_linearize_agrees_with_jvp_and_is_linear(name) -> None:
    f_pb, _ = VECTOR_FNS[name]
    out, f_jvp = pb.linearize(f_pb, _t(A))
    out_jvp, tangent_jvp = pb.jvp(f_pb, (_t(A),), (_t(T),))
    _close(out, out_jvp)
    _close(f_jvp(_t(T)), tangent_jvp)
    t2, a = RNG.standard_normal(4), -2.5
    _close(f_jvp(_t(a * T + t2)), a * np.asarray(f_jvp(_t(T))) + np.asarray(f_jvp(_t(t2))))


def test_jvp_of_grad_is_a_hessian_vector_product() -> None:
    f_pb, f_torch = SCALAR_FNS["tanh_times_x"]
    _, hvp = pb.jvp(pb.grad(f_pb), (_t(A),), (_t(T),))
    _, hvp_ref = torch_jvp(torch.func.grad(f_torch), (_torch(A),), (_torch(T),))
    _close(hvp, hvp_ref.numpy())


def test_jvp_at_a_primal_that_requires_grad() -> None:
    x = pb.tensor(A, requires_grad=True)
    out, tangent = pb.jvp(pb.tanh, (x,), (_t(T),))
    _close(out, np.tanh(A))
    _close(tangent, T * (1 - np.tanh(A) ** 2))


def test_grad_of_a_jvp_matches_torch() -> None:
    f_pb, f_torch = SCALAR_FNS["tanh_times_x"]
    g = pb.grad(lambda x: pb.jvp(f_pb, (x,), (_t(T),))[1])(_t(A))
    ref = torch.func.grad(lambda x: torch_jvp(f_torch, (x,), (_torch(T),))[1])(_torch(A))
    _close(g, ref.numpy())


# ---------------------------------------------------------------- linear_transpose

MASK = np.arange(6) % 2 == 0
M = RNG.standard_normal((6, 4))

# Linear functions of a vector of 6, each returning a vector.
LINEAR_FNS = {
    "strided_slice_plus_sum": lambda x: 2.0 * x[::2] + x.sum(),
    "reversed_minus_self": lambda x: x[::-1] - x,
    "matmul_by_constant": lambda x: x @ _t(M),
    "concatenate_scaled": lambda x: pb.concatenate([x, -3.0 * x], 0),
    "center": lambda x: x - x.mean(),
    "broadcast_transpose": lambda x: pb.broadcast_to(x.reshape(6, 1), (6, 3)).T.reshape(18),
    "divide_by_constant": lambda x: x / 4.0,
    "where_mask": lambda x: pb.where(pb.tensor(MASK), x, 0.0),
    "row_sums": lambda x: x.reshape(2, 3).sum(axis=1) * 4.0,
    "stack_neg": lambda x: pb.stack([x, -x], 1).reshape(12),
}
LINEAR_IDS = list(LINEAR_FNS)


def _matrix(f, n: int) -> np.ndarray:
    with pb.no_grad():
        return np.stack([np.asarray(f(_t(np.eye(n)[i]))) for i in range(n)], axis=1)


@pytest.mark.parametrize("name", LINEAR_IDS)
def test_linear_transpose_is_the_matrix_transpose(name) -> None:
    f = LINEAR_FNS[name]
    matrix = _matrix(f, 6)
    ct = RNG.standard_normal(matrix.shape[0])
    (got,) = pb.linear_transpose(f, _t(np.zeros(6)))(_t(ct))
    assert got.shape == (6,) and got.dtype == pb.float64
    _close(got, matrix.T @ ct)


def test_linear_transpose_of_two_inputs_and_two_outputs() -> None:
    def f(x, y):
        return x + 2.0 * y, x[:2] - y[2:]

    gx, gy = pb.linear_transpose(f, _t(np.zeros(4)), _t(np.zeros(4)))((_t(A), _t(B[:2])))
    _close(gx, A + np.r_[B[:2], 0, 0])
    _close(gy, 2 * A - np.r_[0, 0, B[:2]])


@pytest.mark.parametrize("name", VECTOR_IDS)
def test_linear_transpose_of_linearize_satisfies_the_adjoint_identity(name) -> None:
    f_pb, _ = VECTOR_FNS[name]
    out, f_jvp = pb.linearize(f_pb, _t(A))
    f_vjp = pb.linear_transpose(f_jvp, _t(A))
    ct = RNG.standard_normal(out.shape)
    (jt_ct,) = f_vjp(_t(ct))
    lhs = float(np.sum(ct * np.asarray(f_jvp(_t(T)))))
    rhs = float(np.sum(np.asarray(jt_ct) * T))
    assert lhs == pytest.approx(rhs, rel=1e-10, abs=1e-12)
    # And the transpose of the linearization is the vjp.
    _close(jt_ct, pb.vjp(f_pb, _t(A))[1](_t(ct))[0])


@pytest.mark.parametrize(
    "f",
    [lambda x: pb.tanh(x), lambda x: x * x, lambda x: pb.exp(x) * 2.0, lambda x: x + 1.0],
    ids=["tanh", "square", "exp", "affine"],
)
def test_linear_transpose_of_a_non_linear_function_raises(f) -> None:
    with pytest.raises((TypeError, ValueError)):
        pb.linear_transpose(f, _t(A))(_t(T))


# ---------------------------------------------------------------- no_grad


def test_no_grad_context_records_nothing_and_restores() -> None:
    x = pb.tensor(A, requires_grad=True)
    with pb.no_grad():
        y = pb.tanh(x) * x
        assert not pb.is_grad_enabled()
    assert not y.requires_grad and y._node is None
    assert pb.is_grad_enabled()
    assert (x * 2.0).requires_grad


def test_no_grad_decorator_records_nothing_and_restores_after_an_exception() -> None:
    x = pb.tensor(A, requires_grad=True)

    @pb.no_grad()
    def double(t):
        return t * 2.0

    @pb.no_grad()
    def fail(t):
        raise KeyError("inside")

    assert not double(x).requires_grad
    with pytest.raises(KeyError):
        fail(x)
    assert pb.is_grad_enabled()
    assert (x * 2.0).requires_grad


def test_enable_grad_inside_no_grad_records() -> None:
    x = pb.tensor(A, requires_grad=True)
    with pb.no_grad():
        with pb.enable_grad():
            y = x * 2.0
        z = x * 2.0
    assert y.requires_grad and not z.requires_grad
