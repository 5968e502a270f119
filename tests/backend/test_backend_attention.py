"""CpuAttentionOps' NumPy form of attention against AttentionOps' forward-op defaults
and PyTorch, on heads cut from (N, T, H, D) by a transpose (as attention layers cut
them), over several causal query blocks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pullback.backend import CpuBackend, attention
from pullback.backend.attention import AttentionOps


class Defaults(CpuBackend):
    """CpuBackend's forward ops with AttentionOps' defaults instead of the NumPy form."""

    attention = AttentionOps.attention
    attention_backward = AttentionOps.attention_backward


def _heads(rng, n, t, h, d):
    return rng.standard_normal((n, t, h, d)).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("queries", [5, 3], ids=["as_many_queries_as_keys", "fewer_queries"])
def test_numpy_form_agrees_with_the_defaults_and_torch(causal, queries, monkeypatch):
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 12)  # blocks of two query rows
    rng = np.random.default_rng(0)
    q, k, v = _heads(rng, 2, queries, 2, 3), _heads(rng, 2, 5, 2, 3), _heads(rng, 2, 5, 2, 4)
    g = _heads(rng, 2, queries, 2, 4)
    scale = 0.7
    fast, slow = CpuBackend(), Defaults()
    out = fast.attention(q, k, v, None, None, scale, causal)
    grads = fast.attention_backward(g, q, k, v, None, None, scale, causal, False)
    np.testing.assert_allclose(out, slow.attention(q, k, v, None, None, scale, causal),
                               rtol=1e-12, atol=1e-14)
    for got, want in zip(grads[:3], slow.attention_backward(g, q, k, v, None, None, scale,
                                                            causal, False)[:3]):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    want = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, scale=scale)
    want.backward(torch.tensor(g))
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-10, atol=1e-12)
    for got, t in zip(grads[:3], (tq, tk, tv)):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-10, atol=1e-12)
    assert grads[3] is None


def test_results_are_laid_out_as_their_operands():
    """The output of heads cut from (N, T, H, D) transposes back without a copy."""
    rng = np.random.default_rng(1)
    q, k, v = (_heads(rng, 2, 4, 3, 2).astype(np.float32) for _ in range(3))
    out = CpuBackend().attention(q, k, v, None, None, 0.5, True)
    assert out.transpose(0, 2, 1, 3).flags.c_contiguous
    grads = CpuBackend().attention_backward(out, q, k, v, None, None, 0.5, True, False)
    assert all(x.transpose(0, 2, 1, 3).flags.c_contiguous for x in grads[:3])


def _kept_case(dtype, causal, queries):
    rng = np.random.default_rng(2)
    q, k, v = _heads(rng, 2, queries, 3, 4), _heads(rng, 2, 5, 3, 4), _heads(rng, 2, 5, 3, 2)
    g = _heads(rng, 2, queries, 3, 2)
    return [x.astype(dtype) for x in (q, k, v, g)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("queries", [5, 3], ids=["as_many_queries_as_keys", "fewer_queries"])
def test_probabilities_kept_for_backward_give_the_same_results_bit_for_bit(
        dtype, causal, queries, monkeypatch):
    """A forward run for a backward keeps each block's probabilities beside its result;
    the backward reads them there instead of computing them again, with the very same
    results, and never computes them."""
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 12)  # blocks of one or two rows
    q, k, v, g = _kept_case(dtype, causal, queries)
    cpu = CpuBackend()
    plain = cpu.attention(q, k, v, None, None, 0.6, causal)
    kept = cpu.attention(q, k, v, None, None, 0.6, causal, for_backward=True)
    np.testing.assert_array_equal(kept, plain)
    assert kept.dtype == plain.dtype and kept.strides == plain.strides  # laid out as q
    assert plain.base is None and kept.base.size > kept.size  # the probabilities beside
    want = cpu.attention_backward(g, q, k, v, None, None, 0.6, causal, False)
    computed = []
    real = attention._probabilities
    monkeypatch.setattr(attention, "_probabilities",
                        lambda *a, **kw: computed.append(1) or real(*a, **kw))
    got = cpu.attention_backward(g, q, k, v, None, None, 0.6, causal, False, kept)
    assert not computed
    for a, b in zip(got[:3], want[:3]):
        np.testing.assert_array_equal(a, b)
    # A copy of the result holds no probabilities, nor does a view of some other array
    # (its last element NaN, or a row count that does not fit): computed again.
    foreign = np.full(kept.size + 9, np.nan, dtype)
    foreign[-1] = 2
    for other in (kept.copy(), foreign[:kept.size].reshape(kept.shape),
                  np.full(kept.size + 1, np.nan, dtype)[:kept.size].reshape(kept.shape)):
        computed.clear()
        again = cpu.attention_backward(g, q, k, v, None, None, 0.6, causal, False, other)
        assert computed
        for a, b in zip(again[:3], want[:3]):
            np.testing.assert_array_equal(a, b)


def test_backward_reads_the_forwards_blocks_when_blocks_changed_since(monkeypatch):
    """Blocks follow the threads' count at the call; kept probabilities are read in the
    blocks the forward used, whatever the backward's call would choose."""
    q, k, v, g = _kept_case(np.float64, True, 5)
    cpu = CpuBackend()
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 12)
    kept = cpu.attention(q, k, v, None, None, 0.6, True, for_backward=True)
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 90)  # blocks of 3 rows or more
    fresh = cpu.attention_backward(g, q, k, v, None, None, 0.6, True, False)
    monkeypatch.setattr(attention, "_probabilities", None)  # never called
    got = cpu.attention_backward(g, q, k, v, None, None, 0.6, True, False, kept)
    for a, b in zip(got[:3], fresh[:3]):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


def test_long_contexts_keep_nothing_of_size_t_squared():
    """Probabilities past KEEP_RATIO times the memory of q, k, v and the result (a long
    context on narrow heads) are not kept: the backward computes them again."""
    rng = np.random.default_rng(3)
    q, k, v, g = (_heads(rng, 1, 24, 2, 1) for _ in range(4))  # 24 x 24 scores, E 1
    cpu = CpuBackend()
    for causal in (True, False):
        out = cpu.attention(q, k, v, None, None, 0.6, causal, for_backward=True)
        assert out.base is None
        want = cpu.attention(q, k, v, None, None, 0.6, causal)
        np.testing.assert_array_equal(out, want)
        grads = cpu.attention_backward(g, q, k, v, None, None, 0.6, causal, False, out)
        for a, b in zip(grads[:3], cpu.attention_backward(g, q, k, v, None, None, 0.6,
                                                          causal, False)[:3]):
            np.testing.assert_array_equal(a, b)
    wide = [_heads(rng, 1, 24, 2, 8) for _ in range(3)]  # E 8: 1,152 against 2 x 4 x 384
    assert cpu.attention(*wide, None, None, 0.6, False, for_backward=True).base is not None


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_kept_elements_count_what_the_forward_keeps(causal, monkeypatch):
    """What a plan's memory estimate counts (`kept_elements`) is what the forward keeps
    beside its result, and nothing where it keeps nothing."""
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 12)
    q, k, v, _ = _kept_case(np.float32, causal, 5)
    out = CpuBackend().attention(q, k, v, None, None, 0.6, causal, for_backward=True)
    count = attention.kept_elements(q.shape[:-2], 5, 5, 4, 2, causal)
    assert count == out.base.size - out.size - 1 > 0
    assert attention.kept_elements((1, 2), 24, 24, 1, 1, causal) == 0  # a long context
