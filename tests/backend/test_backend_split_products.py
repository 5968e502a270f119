"""Large matrix products and attention's heads split over BLAS's threads
(pullback.backend.gemm.product, attention's `_by_heads`): the parts compute what one
call does (products within float error, attention bit for bit), in the result's
layout; a product stays whole once a path has had BLAS thread its own products
(recurrences, convolutions not split by batch), and nothing splits again inside a part."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pullback.backend import attention, blas, gemm, recurrent, split
from pullback.backend import conv as backend_conv

needs_openblas = pytest.mark.skipif(not blas.limitable(), reason="NumPy's BLAS is not OpenBLAS")


@pytest.fixture
def halves(monkeypatch):
    """Every product and attention split in two (whatever BLAS's threads), no path
    having threaded BLAS's products yet; `halves(False)`: nothing splits."""
    monkeypatch.setattr(blas, "_threaded", False)

    def choose(on: bool) -> None:
        limit = 0 if on else 1 << 62
        monkeypatch.setattr(gemm, "SPLIT_MACS", limit)
        monkeypatch.setattr(attention, "SPLIT_MACS", limit)
        monkeypatch.setattr(split, "parts", lambda n: [(0, n // 2), (n // 2, n)] if n > 1
                            else [(0, n)])
    return choose


@pytest.fixture
def calls(monkeypatch):
    """The n of every split.over_parts call, recorded, the parts then run as usual."""
    seen: list[int] = []
    original = split.over_parts

    def recording(n, run):
        seen.append(n)
        return original(n, run)

    monkeypatch.setattr(split, "over_parts", recording)
    return seen


SHAPES = [(64, 48, 80), (33, 257, 65), (7, 5, 1), (1, 16, 9)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_split_product_is_one_calls_within_float_error(halves, calls, shape, order, dtype):
    halves(True)
    m, k, n = shape
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    out = np.empty((m, n), dtype, order=order)
    assert gemm.product(a, b, out) is out
    # Rows of a C-ordered result, columns of a Fortran-ordered one (a single row or
    # column is both: by rows): each part's block of the result is contiguous.
    assert calls == [m if out.flags.c_contiguous else n]
    exact = a.astype(np.float64) @ b.astype(np.float64)
    bound = k * np.finfo(dtype).eps * (np.abs(a) @ np.abs(b))
    assert np.all(np.abs(out - exact) <= bound)
    whole = np.matmul(a, b)
    np.testing.assert_allclose(out, whole, rtol=0, atol=float(bound.max()))


def test_products_of_the_matmul_op_and_its_gradients_split(cpu, halves, calls):
    halves(True)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 10, 12)).astype(np.float32)
    w = rng.standard_normal((8, 12)).astype(np.float32)
    y = cpu.matmul(x, w.T)  # a stack times a matrix: one (30, 12) @ (12, 8) product
    u = rng.standard_normal(y.shape).astype(np.float32)
    gx, gw_t = cpu.matmul_backward(u, x, w.T)
    # y by its 30 rows; x's gradient by its 30 rows and w's by its 8, in one hand-over
    # of two parts (CpuBackend._dense_backward)
    assert calls == [30, 2]
    # The weight's gradient keeps the transposed view's layout: its transpose is C-ordered.
    assert gw_t.T.flags.c_contiguous
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    ty = tx @ tw.T
    ty.backward(torch.from_numpy(u))
    for ours, theirs in ((y, ty.detach()), (gx, tx.grad), (gw_t.T, tw.grad)):
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-5, atol=1e-5)


def test_small_or_integer_products_stay_whole(halves, calls, monkeypatch):
    halves(False)
    a = np.ones((64, 64), np.float32)
    gemm.product(a, a, np.empty((64, 64), np.float32))
    halves(True)
    ints = np.arange(12).reshape(3, 4)
    out = np.empty((3, 3), ints.dtype)
    gemm.product(ints, ints.T, out)
    np.testing.assert_array_equal(out, ints @ ints.T)
    assert calls == []


def test_once_a_path_threads_blas_products_stay_whole(halves, calls):
    halves(True)
    a = np.ones((16, 16), np.float32)
    gemm.product(a, a, np.empty((16, 16), np.float32))
    assert calls == [16] and not blas.products_threaded()
    blas.threading_products()
    assert blas.products_threaded()
    out = np.empty((16, 16), np.float32)
    gemm.product(a, a, out)
    assert calls == [16]
    np.testing.assert_array_equal(out, np.full((16, 16), 16, np.float32))


@pytest.mark.parametrize("n, h, split_rows", [(8, 64, False), (8, 256, True), (6, 256, False)])
def test_a_large_recurrence_splits_its_rows_where_each_part_pays(monkeypatch, n, h,
                                                                split_rows):
    # Two parts: 4 rows of 4 H x H = 2**18 multiply-adds at H = 256 split; 4 rows at
    # H = 64, or 3 rows (fewer than a tile's), run whole. BLAS never threads them (its
    # workers would spin on the cores split work needs).
    monkeypatch.setattr(blas, "_threaded", False)
    monkeypatch.setattr(split, "parts", lambda rows: [(0, rows // 2), (rows // 2, rows)])
    ran = []
    monkeypatch.setattr(split, "over_parts", lambda rows, run: ran.append(rows) or [
        run(0, rows // 2), run(rows // 2, rows)])
    rng = np.random.default_rng(2)
    xp = rng.standard_normal((2, n, 4 * h)).astype(np.float32)
    h0, c0 = np.zeros((n, h), np.float32), np.zeros((n, h), np.float32)
    w_hh = rng.standard_normal((4 * h, h)).astype(np.float32)
    recurrent.CpuRecurrentOps().lstm_sequence(xp, h0, c0, w_hh)
    assert ran == ([n] if split_rows else []) and not blas.products_threaded()


def test_a_convolution_blas_threads_is_noted_and_a_split_one_is_not(monkeypatch):
    monkeypatch.setattr(backend_conv, "DIRECT_FORCED", False)  # a path with products
    monkeypatch.setattr(blas, "_threaded", False)
    monkeypatch.setattr(blas, "_split", False)
    monkeypatch.setattr(backend_conv, "SPLIT_MACS", 0)
    x = np.ones((4, 3, 6, 6), np.float32)
    w = np.ones((2, 3, 3, 3), np.float32)
    backend_conv.conv2d(x, w, (1, 1), (0, 0))  # by parts, BLAS on one thread in each
    assert not blas.products_threaded()
    monkeypatch.setattr(backend_conv, "OWN_THREADS_FORCED", True)
    backend_conv.conv2d(x[:1], w, (1, 1), (0, 0))  # a batch of one, on pullback's threads
    assert not blas.products_threaded() and blas.splitting()
    monkeypatch.setattr(backend_conv, "OWN_THREADS_FORCED", False)
    backend_conv.conv2d(x[:1], w, (1, 1), (0, 0))  # a batch of one on BLAS's threads
    assert blas.products_threaded()


@needs_openblas
@pytest.mark.parametrize("split_before,threaded", [(False, False), (True, False), (True, True)])
def test_an_unsplit_product_runs_on_one_blas_thread_once_work_has_split(
        monkeypatch, split_before, threaded):
    """A product too small to split keeps BLAS's threads until pullback has split work in
    this process, then runs on one; unless a path has BLAS thread its products anyway."""
    get, _ = blas._functions()
    before = get()
    if before < 2:
        pytest.skip("BLAS runs on one thread here: nothing to lower")
    monkeypatch.setattr(blas, "_split", split_before)
    monkeypatch.setattr(blas, "_threaded", threaded)
    seen = []
    original = np.matmul

    def watched(*args, **kwargs):
        seen.append(get())
        return original(*args, **kwargs)

    monkeypatch.setattr(gemm.np, "matmul", watched)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    got = [gemm.matmul(a, b), gemm.product(a, b, np.empty((6, 4))),
           gemm.matmul(a[None], b[None])]  # a stack: NumPy's own matmul
    monkeypatch.setattr(gemm.np, "matmul", original)
    assert len(seen) == 3
    assert set(seen) == ({1} if split_before and not threaded else {before})
    assert get() == before
    for result in got:
        np.testing.assert_allclose(result.reshape(6, 4), a @ b, rtol=1e-12)


# The costly elementwise ops (split.costly_elementwise): (name, call, PyTorch's twin).
COSTLY = [
    ("gelu", lambda be, x, u: be.gelu(x), lambda t: F.gelu(t)),
    ("gelu_tanh", lambda be, x, u: be.gelu(x, "tanh"), lambda t: F.gelu(t, approximate="tanh")),
    ("gelu_backward", lambda be, x, u: be.gelu_backward(u, x), None),
    ("gelu_tanh_backward", lambda be, x, u: be.gelu_backward(u, x, "tanh"), None),
    ("exp", lambda be, x, u: be.exp(x), torch.exp),
    ("log", lambda be, x, u: be.log(np.abs(x) + 0.5), lambda t: torch.log(t.abs() + 0.5)),
    ("sigmoid", lambda be, x, u: be.sigmoid(x), torch.sigmoid),
    ("tanh", lambda be, x, u: be.tanh(x), torch.tanh),
    ("silu", lambda be, x, u: be.silu(x), F.silu),
    ("silu_backward", lambda be, x, u: be.silu_backward(u, x), None),
    ("softplus", lambda be, x, u: be.softplus(x), F.softplus),
    ("softplus_backward", lambda be, x, u: be.softplus_backward(u, x), None),
    ("erf", lambda be, x, u: be.erf(x), torch.erf),
    ("sin", lambda be, x, u: be.sin(x), torch.sin),
    ("cos", lambda be, x, u: be.cos(x), torch.cos),
]


@pytest.mark.parametrize("case", COSTLY, ids=[c[0] for c in COSTLY])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_costly_elementwise_ops_split_bit_for_bit(cpu, halves, calls, monkeypatch, case,
                                                  dtype):
    """Large transcendental elementwise ops run in parts (split.costly_elementwise),
    giving one call's result bit for bit; below COSTLY_ELEMENTS, or with operands that
    are not C-contiguous arrays of one shape, one call."""
    _, call, twin = case
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((37, 41)) * 3).astype(dtype)
    up = rng.standard_normal((37, 41)).astype(dtype)
    whole = call(cpu, x, up)
    assert calls == []  # below COSTLY_ELEMENTS
    monkeypatch.setattr(split, "COSTLY_ELEMENTS", 8)
    halves(True)
    parts = call(cpu, x, up)
    assert calls == [x.size]
    assert parts.dtype == dtype and parts.shape == x.shape
    np.testing.assert_array_equal(parts, whole)
    if twin is not None:  # the op it claims to be
        np.testing.assert_allclose(parts, twin(torch.from_numpy(x)).numpy(), rtol=1e-5,
                                   atol=1e-6)
    calls.clear()
    np.testing.assert_array_equal(call(cpu, np.asfortranarray(x), np.asfortranarray(up)),
                                  whole)
    assert calls == []  # not C-contiguous: one call
    assert type(call(cpu, x[0, 0], up[0, 0])) is np.ndarray  # 0-d: an array, as before


def test_inside_a_part_nothing_splits_again(monkeypatch):
    monkeypatch.setattr(blas, "threads", lambda: 2)
    monkeypatch.setattr(blas, "limitable", lambda: True)
    inner = split.over_parts(4, lambda i, j: split.parts(j - i))
    assert inner == [[(0, 2)], [(0, 2)]]
    assert split.parts(4) == [(0, 2), (2, 4)]


HEADS = [((2, 3, 9, 8), 9), ((1, 4, 12, 6), 12), ((3, 5, 4), 7)]


@pytest.mark.parametrize("case", HEADS, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_split_by_heads_is_one_calls_bit_for_bit(cpu, halves, calls, case, causal,
                                                           dtype):
    (*batch, length, e), keys = case
    rng = np.random.default_rng(3)
    q = rng.standard_normal((*batch, length, e)).astype(dtype)
    k, v = (rng.standard_normal((*batch, keys, e)).astype(dtype) for _ in range(2))
    results = {}
    for on in (False, True):
        halves(on)
        out = cpu.attention(q, k, v, None, None, 0.3, causal)
        grads = cpu.attention_backward(np.ones_like(out), q, k, v, None, None, 0.3, causal,
                                       False)
        results[on] = (out, *grads[:3])
    # The first batch axis of more than one is cut: (2, 3) by its 2, (1, 4) by its 4.
    axis = next(size for size in batch if size > 1)
    assert calls == [axis, axis]
    for split_result, whole in zip(results[True], results[False]):
        np.testing.assert_array_equal(split_result, whole)
    mask = None
    if causal:
        mask = torch.ones(length, keys, dtype=torch.bool).tril()
    tq, tk, tv = (torch.from_numpy(t) for t in (q, k, v))
    expected = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, scale=0.3).numpy()
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(results[True][0], expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_blocks_count_their_scores_per_part_of_the_heads(cpu, halves, calls,
                                                                  monkeypatch, causal):
    # 4 x 2 heads of 12 keys: 8 * 12 * 3 scores a block on one thread make blocks of 3
    # query rows; cut into two parts of the heads, blocks of 6, split or not, bit for bit.
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 8 * 12 * 3)
    assert attention.row_blocks((4, 2), 12, 12) == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert attention.row_blocks((4, 2), 12, 12, 2) == [(0, 6), (6, 12)]
    blocks = []
    forward = attention._forward
    monkeypatch.setattr(attention, "_forward",
                        lambda *a: blocks.append(a[5]) or forward(*a))
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((4, 2, 12, 5)) for _ in range(3))
    results = {}
    for on in (False, True):
        halves(on)
        assert attention._head_parts(q.shape[:-2]) == 2
        out = cpu.attention(q, k, v, None, None, 0.4, causal)
        grads = cpu.attention_backward(np.ones_like(out), q, k, v, None, None, 0.4, causal,
                                       False)
        results[on] = (out, *grads[:3])
    assert calls == [4, 4]  # split once each way, when on
    assert blocks == [[(0, 6), (6, 12)]] * 3  # whole, then each of the two parts
    for split_result, whole in zip(results[True], results[False]):
        np.testing.assert_array_equal(split_result, whole)
    monkeypatch.setattr(split, "parts", lambda n: [(0, n)])  # one thread: blocks of 3
    assert attention._head_parts(q.shape[:-2]) == 1
    np.testing.assert_allclose(cpu.attention(q, k, v, None, None, 0.4, causal),
                               results[True][0], rtol=1e-13, atol=1e-15)
    assert blocks[-1] == [(0, 3), (3, 6), (6, 9), (9, 12)]


@pytest.mark.parametrize("threaded", [False, True])
def test_bias_sums_run_on_one_blas_thread_while_products_split(monkeypatch, threaded):
    monkeypatch.setattr(blas, "_threaded", threaded)
    entered = []
    original = blas.one_thread

    def recording():
        entered.append(True)
        return original()

    monkeypatch.setattr(blas, "one_thread", recording)
    x = np.random.default_rng(4).standard_normal((6, 5, 3, 3)).astype(np.float32)
    sums = gemm.bias_sums(x, (5, 1, 1))
    np.testing.assert_allclose(sums, x.sum(axis=(0, 2, 3), keepdims=True)[0], rtol=1e-5)
    assert entered == ([] if threaded else [True])


def test_a_product_into_an_operand_stays_whole(halves, calls):
    halves(True)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((12, 12)).astype(np.float64)
    b = rng.standard_normal((12, 12)).astype(np.float64)
    expected = a @ b
    gemm.product(a, b, b)  # the result over the second operand, read whole by each part
    assert calls == []
    np.testing.assert_allclose(b, expected, rtol=1e-13)
