"""scaled_dot_product_attention beyond the op table: query blocks, dropout, refusals.

The table's tiny operands fit one block; here blocks of one query row are forced, so
that the causal key trimming, the masks sliced per block and the key gradients summed
over blocks are compared with PyTorch too. Dropout is checked against PyTorch given
the very mask pullback drew, and statistically.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pullback as pb
from pullback.backend import attention
from pullback.ops.attention import attention_p
from pullback.tensor.backward import fused_kernels


def _arrays(seed: int, *shapes: tuple) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def _pb_value_and_grads(fn, arrays, g) -> tuple[np.ndarray, list[np.ndarray]]:
    xs = [pb.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*xs)
    (out * pb.tensor(g)).sum().backward()
    return out.numpy(), [x.grad.numpy() for x in xs]


def _torch_value_and_grads(fn, arrays, g) -> tuple[np.ndarray, list[np.ndarray]]:
    xs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*xs)
    (out * torch.tensor(g)).sum().backward()
    return out.detach().numpy(), [x.grad.numpy() for x in xs]


def _assert_agree(pb_fn, torch_fn, arrays, out_shape) -> None:
    g = np.random.default_rng(99).standard_normal(out_shape)
    want, want_grads = _torch_value_and_grads(torch_fn, arrays, g)
    for fused in (True, False):
        with fused_kernels(fused):
            got, grads = _pb_value_and_grads(pb_fn, arrays, g)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
        for i, (a, b) in enumerate(zip(grads, want_grads, strict=True)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, err_msg=f"input {i}")


DEAD_MIDDLE_ROW = np.array([[0.0] * 5, [-np.inf] * 5, [0.0, -np.inf, 0.0, 0.0, 0.0],
                            [0.0] * 5])

BLOCK_CASES = {
    "causal": (dict(is_causal=True), ((2, 6, 3), (2, 5, 3), (2, 5, 2)), None),
    # Keys past the last query get no gradient: a chunk of zeros after the summed ones.
    "causal_fewer_queries": (dict(is_causal=True), ((2, 3, 3), (2, 5, 3), (2, 5, 2)), None),
    "float_mask_per_row": ({}, ((2, 4, 3), (2, 5, 3), (2, 5, 2)), (4, 5)),
    "float_mask_broadcast_rows": ({}, ((2, 4, 3), (2, 5, 3), (2, 5, 2)), (2, 1, 5)),
    "dead_row": ({}, ((2, 4, 3), (2, 5, 3), (2, 5, 2)), "dead"),
}


@pytest.mark.parametrize("case", BLOCK_CASES)
def test_query_blocks_of_one_row_agree_with_torch(case, monkeypatch) -> None:
    monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 1)  # one query row per block
    kw, shapes, mask = BLOCK_CASES[case]
    arrays = _arrays(3, *shapes)
    out_shape = shapes[0][:-1] + (shapes[2][-1],)
    if mask is None:
        _assert_agree(lambda q, k, v: pb.scaled_dot_product_attention(q, k, v, **kw),
                      lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw),
                      arrays, out_shape)
    elif mask == "dead":
        _assert_agree(lambda q, k, v: pb.scaled_dot_product_attention(q, k, v, DEAD_MIDDLE_ROW),
                      lambda q, k, v: F.scaled_dot_product_attention(
                          q, k, v, torch.tensor(DEAD_MIDDLE_ROW)), arrays, out_shape)
    else:
        _assert_agree(pb.scaled_dot_product_attention, F.scaled_dot_product_attention,
                      [*arrays, *_arrays(4, mask)], out_shape)


def _keep_mask(seed: int, shape: tuple, p: float) -> np.ndarray:
    """The mask `dropout_mask` draws from a fresh generator seeded `seed`."""
    return (np.random.default_rng(seed).random(shape) >= p) / (1.0 - p)


@pytest.mark.parametrize("blocks", [False, True], ids=["one_block", "row_blocks"])
def test_dropout_uses_one_mask_for_output_and_gradients(blocks, monkeypatch) -> None:
    if blocks:
        monkeypatch.setattr(attention, "BLOCK_ELEMENTS", 1)
    p, shapes = 0.4, ((2, 4, 3), (2, 5, 3), (2, 5, 2))
    keep = _keep_mask(7, (2, 4, 5), p)
    arrays = _arrays(5, *shapes)

    def reference(q, k, v):
        weights = torch.softmax(q @ k.transpose(-1, -2) / np.sqrt(3), -1)
        return (weights * torch.tensor(keep)) @ v

    _assert_agree(lambda q, k, v: pb.scaled_dot_product_attention(
        q, k, v, dropout_p=p, generator=lambda: np.random.default_rng(7)),
        reference, arrays, (2, 4, 2))


def test_dropout_keeps_weights_at_rate_one_minus_p_and_scales_them() -> None:
    # With v all ones each output is the sum of a row's kept, rescaled weights: 1 on
    # average, and the kept fraction is 1 - p.
    q, k = (pb.tensor(a) for a in _arrays(0, (64, 8, 4), (64, 16, 4)))
    v = pb.tensor(np.ones((64, 16, 1)))
    out = pb.scaled_dot_product_attention(q, k, v, dropout_p=0.25,
                                          generator=lambda: np.random.default_rng(1)).numpy()
    assert abs(out.mean() - 1.0) < 0.03
    keep = _keep_mask(1, (64, 8, 16), 0.25)
    assert abs((keep > 0).mean() - 0.75) < 0.02


def test_dropout_draws_from_the_global_generator() -> None:
    q, k, v = (pb.tensor(a) for a in _arrays(0, (2, 4, 3), (2, 5, 3), (2, 5, 2)))

    def run(seed: int) -> np.ndarray:
        pb.manual_seed(seed)
        return pb.scaled_dot_product_attention(q, k, v, dropout_p=0.5).numpy()

    np.testing.assert_array_equal(run(1), run(1))
    assert not np.array_equal(run(1), run(2))


@pytest.mark.parametrize("args, kwargs, match", [
    (((2, 3, 4), (2, 5, 4), (2, 5, 3)), dict(attn_mask=np.ones((3, 5), bool), is_causal=True),
     "attn_mask and is_causal cannot both be given"),
    (((2, 3, 4), (2, 5, 3), (2, 5, 3)), {}, "query and key embeddings differ: 4 and 3"),
    (((2, 3, 4), (2, 5, 4), (2, 6, 3)), {}, "key and value lengths differ: 5 and 6"),
    (((2, 3, 4), (3, 5, 4), (2, 5, 3)), {}, "batch dimensions .* cannot be broadcast"),
    (((2, 3, 4), (2, 5, 4), (2, 5, 3)), dict(attn_mask=np.zeros((4, 5))), "does not broadcast"),
    (((2, 3, 4), (2, 5, 4), (2, 5, 3)), dict(dropout_p=1.0), r"dropout_p must be in \[0, 1\)"),
    (((4,), (5, 4), (5, 3)), {}, r"need \(..., T, D\) shapes"),
])
def test_bad_arguments_are_refused_naming_the_op(args, kwargs, match) -> None:
    q, k, v = (pb.tensor(a) for a in _arrays(0, *args))
    with pytest.raises(pb.KernelError, match=f"scaled_dot_product_attention: .*{match}"):
        pb.scaled_dot_product_attention(q, k, v, **kwargs)


def test_mixed_dtypes_are_refused() -> None:
    q, k, v = _arrays(0, (3, 4), (5, 4), (5, 2))
    with pytest.raises(pb.KernelError, match="share one floating dtype"):
        pb.scaled_dot_product_attention(pb.tensor(q), pb.tensor(k, dtype=pb.float32),
                                        pb.tensor(v))


@pytest.mark.parametrize("shapes", [((2, 0, 4), (2, 3, 4), (2, 3, 5)),
                                    ((2, 2, 4), (2, 0, 4), (2, 0, 5))],
                         ids=["no_queries", "no_keys"])
def test_no_queries_or_no_keys_give_torchs_zeros(shapes) -> None:
    arrays = _arrays(0, *shapes)
    _assert_agree(pb.scaled_dot_product_attention, F.scaled_dot_product_attention, arrays,
                  shapes[0][:-1] + (shapes[2][-1],))


def test_probabilities_are_kept_only_where_a_backward_follows(monkeypatch) -> None:
    """A forward recorded for a backward (eager with a gradient, an active step of a
    training plan) keeps its probabilities for it; one that no backward reads (no
    gradient, `no_grad`, an inference plan, a plan step the loss does not
    differentiate) keeps nothing beside its result."""
    asked: list[bool] = []
    real = attention.CpuAttentionOps.attention

    def spy(self, *args, for_backward=False):
        asked.append(for_backward)
        return real(self, *args, for_backward=for_backward)

    monkeypatch.setattr(attention.CpuAttentionOps, "attention", spy)
    q, k, v = _arrays(7, (2, 4, 3), (2, 4, 3), (2, 4, 2))

    def attend(x: pb.Tensor) -> pb.Tensor:
        return pb.scaled_dot_product_attention(x, pb.tensor(k), pb.tensor(v), is_causal=True)

    def seen(fn) -> list[bool]:
        asked.clear()
        fn()
        return list(asked)

    grad = pb.tensor(q, requires_grad=True)
    assert seen(lambda: attend(grad)) == [True]
    assert seen(lambda: attend(pb.tensor(q))) == [False]
    with pb.no_grad():
        assert seen(lambda: attend(grad)) == [False]
    inference = pb.compile(attend, q)
    assert seen(lambda: inference(q)) == [False]
    w = pb.tensor(np.ones((2, 1, 1)), requires_grad=True)
    differentiated = pb.compile(lambda x: (attend(x * w) ** 2).sum(), q,
                                mode=pb.LoweringMode.TRAINING)
    assert seen(lambda: differentiated(q)) == [True]
    assert w.grad is not None and np.all(np.isfinite(w.grad.numpy()))
    assert "beside it that its backward reads" in differentiated.explain()
    assert "beside it" not in inference.explain()
    # The attention reads the input alone: the loss differentiates only what follows it.
    constant = pb.compile(lambda x: (attend(x) * w).sum(), q, mode=pb.LoweringMode.TRAINING)
    assert seen(lambda: constant(q)) == [False]
    assert "beside it" not in constant.explain()
    # The plan's memory estimate counts them.
    kept_peak = differentiated.peak_bytes()
    monkeypatch.setattr(attention_p, "saving_impl", None)  # as before: nothing beside
    again = pb.compile(lambda x: (attend(x * w) ** 2).sum(), q, mode=pb.LoweringMode.TRAINING)
    assert kept_peak > again.peak_bytes()


def test_plan_with_kept_probabilities_trains_as_eager_and_torch() -> None:
    """A training plan's attention reads its kept probabilities: the same gradients as
    eager's and PyTorch's."""
    q, k, v = _arrays(8, (2, 2, 6, 3), (2, 2, 6, 3), (2, 2, 6, 4))
    weights = [pb.tensor(a.copy(), requires_grad=True) for a in (q, k, v)]

    def loss(scale: pb.Tensor) -> pb.Tensor:
        out = pb.scaled_dot_product_attention(*(w * scale for w in weights), is_causal=True)
        return (out * out).sum()

    s = np.full((1, 1, 1, 1), 1.5)
    plan = pb.compile(loss, s, mode=pb.LoweringMode.TRAINING)
    plan(s)
    got = [w.grad.numpy().copy() for w in weights]
    tw = [torch.tensor(a * 1.5, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*tw, is_causal=True)
    (out * out).sum().backward()
    for a, t in zip(got, tw):
        np.testing.assert_allclose(a, t.grad.numpy() * 1.5, rtol=1e-10, atol=1e-12)
