"""Row kernels (softmax, log_softmax, cross-entropy, layer norm)
against NumPy formulas, their backward against central differences and through
pb.gradcheck, and the CpuBackend methods against FusedOps' forward-op defaults."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_check import LARGE, SMALL, vjp_check

import pullback as pb
from pullback.backend import CpuBackend, KernelError, ThreadedCpuBackend
from pullback.backend.fused import FusedOps
from pullback.kernels import rows

TOL = {np.float32: {"rtol": 2e-5, "atol": 1e-6}, np.float64: {"rtol": 1e-12, "atol": 1e-14}}
EPS = 1e-5


def softmax_ref(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def log_softmax_ref(x):
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def layer_norm_ref(x, w, b, eps=EPS):
    mean = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps)
    return (x - mean) * rstd * w + b, mean[..., 0], rstd[..., 0]


def _data(rng, shape, dtype):
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    labels = rng.integers(0, shape[-1], shape[:-1])
    w = rng.standard_normal(shape[-1]).astype(dtype)
    b = rng.standard_normal(shape[-1]).astype(dtype)
    return x, labels, w, b


def _check_forwards(x, labels, w, b, dtype, parallel):
    call = (lambda k, *a: k(*a)) if parallel else (lambda k, *a: k.serial(*a))
    tol = TOL[dtype]
    np.testing.assert_allclose(call(rows.softmax, x), softmax_ref(x.astype(np.float64)), **tol)
    np.testing.assert_allclose(call(rows.log_softmax, x), log_softmax_ref(x.astype(np.float64)),
                               **tol)
    loss = call(rows.cross_entropy, x, labels)
    expected = -np.take_along_axis(log_softmax_ref(x.astype(np.float64)), labels[..., None],
                                   -1)[..., 0]
    np.testing.assert_allclose(loss, expected, **tol)
    for got, want in zip(call(rows.layer_norm, x, w, b, EPS), layer_norm_ref(x, w, b)):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, **tol)
    for got, want in zip(call(rows.layer_norm_statistics, x, EPS), layer_norm_ref(x, w, b)[1:]):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_kernels_match_numpy_formulas(rng, dtype):
    _check_forwards(*_data(rng, SMALL, dtype), dtype, parallel=False)
    x, labels, w, b = _data(rng, (2, 3, 7), dtype)  # rows of a 3-d array: the last axis
    _check_forwards(x, labels, w, b, dtype, parallel=False)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_row_kernels_run_parallel_and_match(rng, dtype):
    x, labels, w, b = _data(rng, LARGE, dtype)
    _check_forwards(x, labels, w, b, dtype, parallel=True)
    assert (dtype.__name__, "rows", "parallel") in rows.layer_norm.signatures
    np.testing.assert_array_equal(rows.softmax(x), rows.softmax.serial(x))
    u = rng.standard_normal(LARGE).astype(dtype)
    mean, rstd = rows.layer_norm(x, w, b, EPS)[1:]
    for parallel, serial in zip(rows.layer_norm_backward(u, x, w, mean, rstd),
                                rows.layer_norm_backward.serial(u, x, w, mean, rstd)):
        # The weight and bias sums add their rows in another order: cancellation-scale atol.
        np.testing.assert_allclose(parallel, serial, rtol=1e-5 if dtype == np.float32 else 1e-12,
                                   atol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [SMALL, LARGE])
def test_layer_norm_backward_of_input_is_the_statistics_then_the_backward(rng, dtype, shape):
    # Its rows' statistics computed in its own pass are layer_norm_statistics' bits, so
    # its gradients are the two kernels' one after the other, bit for bit.
    x, _, w, _ = _data(rng, shape, dtype)
    u = rng.standard_normal(shape).astype(dtype)
    mean, rstd = rows.layer_norm_statistics.serial(x, EPS)
    want = rows.layer_norm_backward.serial(u, x, w, mean, rstd)
    for run in (rows.layer_norm_backward_of_input.serial, rows.layer_norm_backward_of_input):
        got = run(u, x, w, EPS)
        np.testing.assert_array_equal(got[0], want[0])
        for g, ref in zip(got[1:], want[1:]):  # sums over rows: chunked when parallel
            np.testing.assert_allclose(g, ref, rtol=1e-5 if dtype == np.float32 else 1e-12,
                                       atol=1e-5 if dtype == np.float32 else 1e-12)


def test_forward_kernels_name_their_backward():
    assert rows.softmax.backward is rows.softmax_backward
    assert rows.log_softmax.backward is rows.log_softmax_backward
    assert rows.cross_entropy.backward is rows.cross_entropy_backward
    assert rows.layer_norm.backward is rows.layer_norm_backward


def test_softmax_backwards_are_the_vjp_of_their_forwards(rng):
    x = rng.standard_normal(SMALL) * 3
    for forward in (rows.softmax, rows.log_softmax):
        vjp_check(forward, lambda u, f=forward: [f.backward(u, f(x))], [x], [0], rng)


def test_cross_entropy_backward_is_the_vjp_of_its_forward(rng):
    x, labels, _, _ = _data(rng, SMALL, np.float64)
    vjp_check(lambda x: rows.cross_entropy(x, labels),
              lambda u: [rows.cross_entropy_backward(u, x, labels)], [x], [0], rng)


def test_layer_norm_backward_is_the_vjp_of_its_forward(rng):
    x, _, w, b = _data(rng, SMALL, np.float64)

    def backward(u):
        mean, rstd = rows.layer_norm(x, w, b, EPS)[1:]
        return rows.layer_norm_backward(u, x, w, mean, rstd)

    vjp_check(lambda x, w, b: rows.layer_norm(x, w, b, EPS), backward, [x, w, b], [0, 1, 2], rng)


class LayerNorm(pb.CustomOp):
    """The layer_norm kernel pair as a pullback op, for pb.gradcheck."""

    def forward(self, x, w, b):
        return rows.layer_norm(x, w, b, EPS)[0]

    def backward(self, upstream, inputs, output):
        x, w, b = inputs
        mean, rstd = rows.layer_norm(x, w, b, EPS)[1:]
        return rows.layer_norm_backward(upstream, x, w, mean, rstd)


class CrossEntropy(pb.CustomOp):
    """The cross-entropy kernel pair as a pullback op, for fixed labels."""

    def __init__(self, labels):
        self.labels = labels

    def forward(self, logits):
        return rows.cross_entropy(logits, self.labels)

    def backward(self, upstream, inputs, output):
        return (rows.cross_entropy_backward(upstream, inputs[0], self.labels),)


def test_kernel_pairs_pass_gradcheck_as_pullback_ops(rng):
    x, labels, w, b = _data(rng, SMALL, np.float64)
    x, w, b = pb.tensor(x), pb.tensor(w), pb.tensor(b)
    assert pb.gradcheck(lambda x, w, b: LayerNorm()(x, w, b), (x, w, b))
    assert pb.gradcheck(lambda x: CrossEntropy(labels)(x), (x,))


@pytest.mark.parametrize("f", [lambda x: pb.softmax(x), lambda x: pb.log_softmax(x),
                               lambda x: pb.nn.cross_entropy(x, np.array([0, 4, 2]))],
                         ids=["softmax", "log_softmax", "cross_entropy_loss"])
def test_ops_running_the_row_kernels_pass_gradcheck(f):
    assert pb.gradcheck(f, (pb.randn(3, 5, dtype=np.float64, seed=5),))


# -- the backend methods ---------------------------------------------------------------


def _fused_calls(backend, x, labels, w, b, u):
    """Every FusedOps method on `backend`, with the base class's (forward-op) version
    when `base` is FusedOps."""
    y, mean, rstd = backend.layer_norm(x, w, b, EPS)
    out = [backend.cross_entropy(x, labels),
           backend.cross_entropy_backward(u[..., 0], x, labels), y, mean, rstd,
           *backend.layer_norm_backward(u, x, w, mean, rstd),
           *backend.layer_norm_statistics(x, EPS),
           *backend.layer_norm_backward_of_input(u, x, w, EPS)]
    return out


class Defaults(CpuBackend):
    """CpuBackend's forward ops with FusedOps' defaults instead of the kernels."""

    cross_entropy = FusedOps.cross_entropy
    cross_entropy_backward = FusedOps.cross_entropy_backward
    layer_norm = FusedOps.layer_norm
    layer_norm_backward = FusedOps.layer_norm_backward
    layer_norm_statistics = FusedOps.layer_norm_statistics
    layer_norm_backward_of_input = FusedOps.layer_norm_backward_of_input


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_backend_fused_ops_match_the_forward_op_defaults(rng, dtype):
    x, labels, w, b = _data(rng, SMALL, dtype)
    u = rng.standard_normal(SMALL).astype(dtype)
    tol = {np.float16: {"rtol": 1e-2, "atol": 1e-2}, np.float32: {"rtol": 1e-5, "atol": 1e-5},
           np.float64: {"rtol": 1e-12, "atol": 1e-12}}[dtype]
    for got, want in zip(_fused_calls(CpuBackend(), x, labels, w, b, u),
                         _fused_calls(Defaults(), x, labels, w, b, u)):
        assert got.dtype == want.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, **tol)


def test_threaded_backend_fused_ops_match_cpu(rng):
    x, labels, w, b = _data(rng, LARGE, np.float32)
    u = rng.standard_normal(LARGE).astype(np.float32)
    threaded = ThreadedCpuBackend(num_threads=2)
    for got, want in zip(_fused_calls(threaded, x, labels, w, b, u),
                         _fused_calls(CpuBackend(), x, labels, w, b, u)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # sums in other orders


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("width", [128, 37, 1])
def test_layer_norm_statistics_are_the_forward_kernels_own(rng, dtype, width):
    """What layer_norm's backward recomputes is, bit for bit, what its forward normalized
    by (widths that fill vector lanes, leave a remainder, or hold one element)."""
    x = (rng.standard_normal((5, 3, width)) * 3 + 1).astype(dtype)
    w, b = np.ones(width, dtype), np.zeros(width, dtype)
    _, mean, rstd = CpuBackend().layer_norm(x, w, b, EPS)
    got_mean, got_rstd = CpuBackend().layer_norm_statistics(x, EPS)
    assert got_mean.shape == got_rstd.shape == (5, 3)
    assert np.array_equal(got_mean, mean) and np.array_equal(got_rstd, rstd)


def test_layer_norm_without_weight_or_bias(rng):
    x = rng.standard_normal(SMALL)
    y = CpuBackend().layer_norm(x, None, None, EPS)[0]
    np.testing.assert_allclose(y, layer_norm_ref(x, 1.0, 0.0)[0], rtol=1e-12)


def test_backend_fused_op_errors_name_the_op():
    cpu = CpuBackend()
    logits = np.zeros((3, 4))
    with pytest.raises(KernelError, match=r"cross_entropy: .*labels must lie in \[0, 4\)"):
        cpu.cross_entropy(logits, np.array([0, 4, 1]))
    with pytest.raises(KernelError, match=r"cross_entropy: .*labels of shape"):
        cpu.cross_entropy(logits, np.array([0, 1]))
    with pytest.raises(KernelError, match="labels must be integers"):
        cpu.cross_entropy(logits, np.zeros(3))
    with pytest.raises(KernelError, match=r"layer_norm: .*at least one dimension"):
        cpu.layer_norm(np.float64(1.0), None, None, EPS)
    with pytest.raises(KernelError, match=r"layer_norm: .*expected a floating dtype"):
        cpu.layer_norm(np.ones((2, 3), dtype=np.int64), None, None, EPS)


def test_cross_entropy_backward_takes_one_upstream_for_all_rows(rng):
    x, labels, _, _ = _data(rng, SMALL, np.float32)
    cpu = CpuBackend()
    np.testing.assert_allclose(cpu.cross_entropy_backward(2.0, x, labels),
                               cpu.cross_entropy_backward(np.full(3, 2.0, np.float32), x, labels))
    np.testing.assert_allclose(Defaults().cross_entropy_backward(2.0, x, labels),
                               cpu.cross_entropy_backward(2.0, x, labels), rtol=1e-5, atol=1e-6)


def test_cross_entropy_kernel_gives_nan_for_a_label_out_of_range():
    loss = rows.cross_entropy(np.zeros((2, 3)), np.array([1, 3]))
    assert np.isfinite(loss[0]) and np.isnan(loss[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_causal_softmax_weights_the_first_seen_elements_and_zeroes_the_rest(rng, dtype):
    x = (rng.standard_normal((2, 3, 5)) * 3).astype(dtype)
    seen = np.array([[1, 3, 5], [5, 2, 4]], dtype=np.intp)
    scale = float(dtype(0.3))
    want = np.zeros(x.shape)
    for row in np.ndindex(seen.shape):
        want[row][:seen[row]] = softmax_ref(scale * x[row][:seen[row]].astype(np.float64))
    got = rows.causal_softmax(x, seen, scale)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want, **TOL[dtype])
    assert not got[seen[..., None] <= np.arange(5)].any()  # exactly zero past `seen`
    # Every element seen: softmax of the scores scaled in the row's dtype, bit for bit.
    every = np.full(seen.shape, 5, np.intp)
    assert np.array_equal(rows.causal_softmax(x, every, scale), rows.softmax(x * dtype(scale)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scaled_softmax_backward_is_softmax_backward_times_the_scale(rng, dtype):
    y = rows.softmax((rng.standard_normal((4, 7)) * 3).astype(dtype))
    u = rng.standard_normal((4, 7)).astype(dtype)
    scale = float(dtype(0.3))
    got = rows.scaled_softmax_backward(u, y, scale)
    assert got.dtype == dtype
    assert np.array_equal(got, rows.softmax_backward(u, y) * dtype(scale))
