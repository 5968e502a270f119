"""Every backward kernel of CpuBackend against (a) the BackwardOps default built from
forward ops and (b) central differences of the forward op, plus dtype preservation.

A case is (primals, forward, backward): backward(backend, upstream, *primals, output)
returns one gradient per primal; the checks run over one table of cases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest


@dataclass
class Case:
    name: str
    shapes: tuple  # one shape per primal
    forward: Callable[..., Any]
    backward: Callable[..., tuple]
    domain: str = "real"

    def primals(self, rng, dtype):
        low, high = {"real": (-2, 2), "positive": (0.5, 2), "no_kink": (0.2, 2)}[self.domain]
        arrays = [rng.uniform(low, high, size=s) for s in self.shapes]
        if self.domain == "no_kink":  # keep |x| away from relu/abs kinks and max/min ties
            arrays = [a * rng.choice([-1, 1], size=a.shape) for a in arrays]
        return [a.astype(dtype) for a in arrays]


UNARY = [
    ("relu_backward", "relu", "input", "no_kink"),
    ("sigmoid_backward", "sigmoid", "output", "real"),
    ("tanh_backward", "tanh", "output", "real"),
    ("exp_backward", "exp", "output", "real"),
    ("log_backward", "log", "input", "positive"),
    ("sqrt_backward", "sqrt", "output", "positive"),
    ("abs_backward", "abs", "input", "no_kink"),
    ("silu_backward", "silu", "input", "real"),
    ("softplus_backward", "softplus", "input", "real"),
]
BROADCAST = [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((4,), ())]
MATMUL = [
    ((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
    ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 5)), ((2, 3, 4), (2, 4, 5)),
]


def _unary(kernel, op, saved, domain):
    def backward(b, u, x, y):
        return (getattr(b, kernel)(u, x if saved == "input" else y),)

    return Case(kernel, ((3, 5),), lambda b, x: getattr(b, op)(x), backward, domain)


def _binary(op, shapes):
    if op in ("add", "sub"):
        backward = lambda b, u, x, z, y: getattr(b, f"{op}_backward")(u, x.shape, z.shape)
    else:
        backward = lambda b, u, x, z, y: getattr(b, f"{op}_backward")(u, x, z)
    domain = {"div": "positive", "maximum": "no_kink", "minimum": "no_kink"}.get(op, "real")
    return Case(f"{op}_backward{shapes}", shapes, lambda b, x, z: getattr(b, op)(x, z),
                backward, domain)


def _cases():
    cases = [_unary(*row) for row in UNARY]
    for approximate in ("none", "tanh"):
        cases.append(Case(
            f"gelu_backward[{approximate}]", ((3, 5),),
            lambda b, x, a=approximate: b.gelu(x, a),
            lambda b, u, x, y, a=approximate: (b.gelu_backward(u, x, a),),
        ))
    for axis in (0, -1):
        cases.append(Case(f"softmax_backward[{axis}]", ((3, 5),),
                          lambda b, x, a=axis: b.softmax(x, a),
                          lambda b, u, x, y, a=axis: (b.softmax_backward(u, y, a),)))
        cases.append(Case(f"log_softmax_backward[{axis}]", ((3, 5),),
                          lambda b, x, a=axis: b.log_softmax(x, a),
                          lambda b, u, x, y, a=axis: (b.log_softmax_backward(u, y, a),)))
    for shape, axes, keep in [((2, 3, 4), (0, 2), False), ((2, 3, 4), (1,), True),
                              ((2, 3), (), False), ((2, 3), (0, 1), False)]:
        cases.append(Case(f"reduce_sum_backward{shape}{axes}{keep}", (shape,),
                          lambda b, x, a=axes, k=keep: b.reduce_sum(x, a, k),
                          lambda b, u, x, y, a=axes, k=keep:
                          (b.reduce_sum_backward(u, x.shape, a, k),)))
    for shape, axes, keep in [((2, 3, 4), (1,), False), ((2, 3, 4), (0, 2), True)]:
        cases.append(Case(f"reduce_max_backward{shape}{axes}{keep}", (shape,),
                          lambda b, x, a=axes, k=keep: b.reduce_max(x, a, k),
                          lambda b, u, x, y, a=axes, k=keep:
                          (b.reduce_max_backward(u, x, y, a, k),)))
    for op in ("add", "sub", "mul", "div", "maximum", "minimum"):
        cases.extend(_binary(op, shapes) for shapes in BROADCAST)
    cases.extend(
        Case(f"matmul_backward{shapes}", shapes, lambda b, x, z: b.matmul(x, z),
             lambda b, u, x, z, y: b.matmul_backward(u, x, z))
        for shapes in MATMUL
    )
    # a dense layer's product and bias (x @ w.T + b, and x @ w + b), one step backward
    for shapes, transposed in [(((2, 3, 4), (5, 4), (5,)), True), (((3, 4), (4, 5), (5,)), False)]:
        cases.append(Case(
            f"matmul_bias_backward{shapes}", shapes,
            lambda b, x, w, bias, t=transposed: b.add(b.matmul(x, w.T if t else w), bias),
            lambda b, u, x, w, bias, y, t=transposed: (
                lambda g: (g[0], g[1].T if t else g[1], g[2]))(
                b.matmul_bias_backward(u, x, w.T if t else w)),
        ))
    for stride, padding in [((1, 1), (0, 0)), ((2, 1), (1, 2))]:
        cases.append(Case(
            f"conv2d_backward{stride}{padding}", ((2, 3, 7, 6), (4, 3, 3, 2)),
            lambda b, x, w, s=stride, p=padding: b.conv2d(x, w, s, p),
            lambda b, u, x, w, y, s=stride, p=padding: (
                b.conv2d_input_backward(u, w, x.shape, s, p),
                b.conv2d_weight_backward(u, x, w.shape, s, p),
            ),
        ))
    cases.append(Case(
        "conv2d_bias_backward", ((3,),),
        lambda b, bias: b.mul(b.reshape(bias, (1, 3, 1, 1)), np.ones((2, 3, 4, 5), bias.dtype)),
        lambda b, u, bias, y: (b.conv2d_bias_backward(u),),
    ))
    # relu after a per-channel bias: relu's backward and the bias's gradient together
    cases.append(Case(
        "relu_bias_backward", ((2, 3, 4, 5), (3,)),
        lambda b, x, bias: b.relu(b.add(x, b.reshape(bias, (1, 3, 1, 1)))),
        lambda b, u, x, bias, y: (lambda g: (g[0], b.reshape(g[1], (3,))))(
            b.relu_bias_backward(u, y, (1, 3, 1, 1))),
    ))
    for kernel, stride, padding in [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 1), (1, 1))]:
        cases.append(Case(
            f"max_pool2d_backward{kernel}{stride}{padding}", ((2, 2, 7, 6),),
            lambda b, x, k=kernel, s=stride, p=padding: b.max_pool2d(x, k, s, p),
            lambda b, u, x, y, k=kernel, s=stride, p=padding:
            (b.max_pool2d_backward(u, x, y, k, s, p),),
        ))
        cases.append(Case(
            f"avg_pool2d_backward{kernel}{stride}{padding}", ((2, 2, 7, 6),),
            lambda b, x, k=kernel, s=stride, p=padding: b.avg_pool2d(x, k, s, p),
            lambda b, u, x, y, k=kernel, s=stride, p=padding:
            (b.avg_pool2d_backward(u, x.shape, k, s, p),),
        ))
    return cases


CASES = _cases()


def _run(backend, case, primals, rng):
    out = case.forward(backend, *primals)
    upstream = rng.standard_normal(np.shape(out)).astype(out.dtype)
    return upstream, case.backward(backend, upstream, *primals, out)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_backward_matches_central_differences(cpu, rng, case):
    primals = case.primals(rng, np.float64)
    upstream, grads = _run(cpu, case, primals, rng)
    directions = [rng.standard_normal(np.shape(p)) for p in primals]
    eps = 1e-6
    plus = case.forward(cpu, *[p + eps * d for p, d in zip(primals, directions, strict=True)])
    minus = case.forward(cpu, *[p - eps * d for p, d in zip(primals, directions, strict=True)])
    numeric = np.sum(upstream * (plus - minus)) / (2 * eps)
    analytic = sum(np.sum(g * d) for g, d in zip(grads, directions, strict=True))
    for g, p in zip(grads, primals, strict=True):
        assert g.shape == np.shape(p)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fused_backward_matches_default(cpu, forward_only, rng, case):
    primals = case.primals(rng, np.float64)
    _, fused = _run(cpu, case, primals, np.random.default_rng(7))
    _, default = _run(forward_only, case, primals, np.random.default_rng(7))
    for f, d in zip(fused, default, strict=True):
        np.testing.assert_allclose(f, d, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_backward_keeps_f32(cpu, forward_only, rng, case):
    primals = case.primals(rng, np.float32)
    for backend in (cpu, forward_only):
        _, grads = _run(backend, case, primals, rng)
        assert all(g.dtype == np.float32 for g in grads), backend.name


@pytest.mark.parametrize("op", ["mul", "div", "maximum", "matmul"])
@pytest.mark.parametrize("needed", [(True, False), (False, True)])
def test_binary_backward_skips_unneeded_grads(cpu, forward_only, rng, op, needed):
    x = rng.uniform(0.5, 2, (3, 4))
    z = rng.uniform(0.5, 2, (4, 4) if op == "matmul" else (1, 4))
    upstream = rng.standard_normal(getattr(cpu, op)(x, z).shape)
    both = getattr(cpu, f"{op}_backward")(upstream, x, z)
    for backend in (cpu, forward_only):
        grads = getattr(backend, f"{op}_backward")(upstream, x, z, needed=needed)
        for grad, full, wanted in zip(grads, both, needed, strict=True):
            if wanted:
                np.testing.assert_allclose(grad, full)
            else:
                assert grad is None


def test_add_sub_backward_skip_unneeded_grads(cpu):
    upstream = np.ones((2, 3))
    assert cpu.add_backward(upstream, (2, 3), (3,), needed=(False, True))[0] is None
    assert cpu.sub_backward(upstream, (2, 3), (3,), needed=(True, False))[1] is None


def test_add_backward_passes_upstream_through_when_nothing_is_broadcast(cpu):
    # No copy: the core never writes into a cotangent, and .grad takes its own copy.
    upstream = np.ones((2, 3))
    grads = cpu.add_backward(upstream, (2, 3), (2, 3))
    assert all(g is upstream for g in grads)


@pytest.mark.parametrize(("op", "lhs_share", "rhs_share"),
                         [("maximum", [0.5, 1.0, 0.0], [0.5, 0.0, 1.0]),
                          ("minimum", [0.5, 0.0, 1.0], [0.5, 1.0, 0.0])])
def test_maximum_minimum_split_ties_evenly(cpu, forward_only, op, lhs_share, rhs_share):
    x, z = np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 5.0])
    for backend in (cpu, forward_only):
        grad_lhs, grad_rhs = getattr(backend, f"{op}_backward")(np.ones(3), x, z)
        assert grad_lhs.tolist() == lhs_share and grad_rhs.tolist() == rhs_share


def test_reduce_max_backward_shares_ties_equally(cpu, forward_only):
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    y = x.max(axis=1)
    for backend in (cpu, forward_only):
        grad = backend.reduce_max_backward(np.array([1.0, 4.0]), x, y, (1,), False)
        assert grad.tolist() == [[0.0, 0.5, 0.5], [2.0, 2.0, 0.0]]


def test_max_pool2d_backward_routes_ties_to_first_max(cpu, forward_only):
    x = np.ones((1, 1, 3, 3))
    y = cpu.max_pool2d(x, (2, 2), (1, 1), (0, 0))
    for backend in (cpu, forward_only):
        grad = backend.max_pool2d_backward(np.ones_like(y), x, y, (2, 2), (1, 1), (0, 0))
        assert grad[0, 0].tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]


def test_matmul_backward_reduces_broadcast_batch(cpu, rng):
    x, w = rng.standard_normal((1, 3, 4)), rng.standard_normal((5, 4, 2))
    upstream = rng.standard_normal((5, 3, 2))
    grad_x, grad_w = cpu.matmul_backward(upstream, x, w)
    assert grad_x.shape == (1, 3, 4) and grad_w.shape == (5, 4, 2)
    expected = sum(upstream[i] @ w[i].T for i in range(5))
    np.testing.assert_allclose(grad_x[0], expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_bias_backward_keeps_relus_mask_rule_and_writes_into_out(cpu, forward_only, rng,
                                                                    dtype):
    # relu's backward multiplies by its mask: a NaN or infinite upstream where relu's
    # output is not positive gives NaN, as relu_backward does; the bias's gradient sums
    # the result per channel.
    y = np.maximum(rng.standard_normal((3, 4, 2, 5)), 0).astype(dtype)
    upstream = rng.standard_normal(y.shape).astype(dtype)
    upstream[0, 1, 0, :3] = [np.nan, np.inf, -np.inf]
    y[0, 1, 0, :2] = 0.0
    y[1, 2, 1, 1] = np.nan
    out = np.full_like(y, 7.0)
    grad, bias = cpu.relu_bias_backward(upstream, y, (1, 4, 1, 1), out=out)
    assert grad is out and bias.shape == (1, 4, 1, 1) and bias.dtype == dtype
    with np.errstate(invalid="ignore"):
        want, want_bias = forward_only.relu_bias_backward(upstream, y, (1, 4, 1, 1))
        np.testing.assert_array_equal(grad, cpu.relu_backward(upstream, y))
    np.testing.assert_array_equal(np.isnan(grad), np.isnan(want))
    np.testing.assert_allclose(bias, want_bias, rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert np.isnan(bias[0, 1, 0, 0]) and not np.isnan(bias[0, [0, 2, 3], 0, 0]).any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [2048, 6])  # split over the threads, and whole
def test_matmul_bias_backward_sums_beside_the_weight_gradient(cpu, forward_only, rng, dtype,
                                                               rows):
    # A dense layer (x @ w.T + b) large enough that the weight gradient's product splits:
    # each part sums its own columns of upstream for the bias. Against the default and
    # the separate kernels, with every subset of the gradients and the lhs into `out`.
    x = rng.standard_normal((rows // 2, 2, 96)).astype(dtype)
    w = rng.standard_normal((160, 96)).astype(dtype)
    upstream = rng.standard_normal((rows // 2, 2, 160)).astype(dtype)
    tol = {"rtol": 2e-5, "atol": 1e-4} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-12}
    dx, dw = cpu.matmul_backward(upstream, x, w.T)
    db = cpu.sum_to_shape(upstream, (160,))
    for needed in [(True, True, True), (False, True, True), (True, False, True),
                   (True, True, False), (False, False, True)]:
        for backend in (cpu, forward_only):
            got = backend.matmul_bias_backward(upstream, x, w.T, needed=needed)
            for g, want, wanted in zip(got, (dx, dw, db), needed, strict=True):
                if not wanted:
                    assert g is None
                    continue
                assert g.shape == want.shape and g.dtype == dtype
                np.testing.assert_allclose(g, want, **tol)
    x2, up2 = x.reshape(rows, 96), upstream.reshape(rows, 160)
    out = np.full((rows, 96), 7.0, dtype)
    got = cpu.matmul_bias_backward(up2, x2, w.T, out=out)
    assert got[0] is out
    np.testing.assert_allclose(out, dx.reshape(rows, 96), **tol)
    np.testing.assert_allclose(got[2], db, **tol)
    # Both products' blocks are the ones their own splits give: the same bits.
    got = cpu.matmul_bias_backward(upstream, x, w.T)
    np.testing.assert_array_equal(got[0], dx)
    np.testing.assert_array_equal(got[1], dw)


def test_matmul_bias_backward_hands_both_products_to_the_threads_at_once(cpu, rng,
                                                                         monkeypatch):
    from pullback.backend import blas, split
    calls = []
    real = split.over_parts
    monkeypatch.setattr(split, "over_parts", lambda n, run: calls.append(n) or real(n, run))
    monkeypatch.setattr(split, "parts", lambda n: [(0, n // 2), (n // 2, n)])
    # Whatever ran before in this process: a convolution would have had BLAS thread its
    # products from then on (blas.products_threaded), and nothing split.
    monkeypatch.setattr(blas, "products_threaded", lambda: False)
    x = rng.standard_normal((2048, 96)).astype(np.float32)
    w = rng.standard_normal((160, 96)).astype(np.float32)
    upstream = rng.standard_normal((2048, 160)).astype(np.float32)
    got = cpu.matmul_bias_backward(upstream, x, w.T)
    assert calls == [2]  # one hand-over: each part's input, weight and bias blocks
    np.testing.assert_allclose(got[0], upstream @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], (upstream.T @ x).T, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got[2], upstream.sum(0), rtol=1e-4, atol=1e-4)
