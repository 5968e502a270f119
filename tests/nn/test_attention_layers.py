"""MultiheadAttention and TransformerEncoderLayer against their PyTorch twins.

Each pullback layer loads its twin's state dict (through NumPy, unchanged), then
outputs, input gradients and parameter gradients are compared in float64, in
training and eval mode, and over a few SGD steps; PyTorch's mask conventions (bool
True = not allowed) are checked by masks that would differ under the opposite one.
Dropout above zero is checked for reproducibility and for its expectation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback import nn, optim

E, HEADS, N, L, S = 8, 2, 2, 4, 5
TOL = dict(rtol=1e-9, atol=1e-11)


def _state(module: torch.nn.Module) -> dict[str, np.ndarray]:
    return {name: value.detach().numpy().copy() for name, value in module.state_dict().items()}


def _twins(make_pb, make_torch, seed: int = 0):
    torch.manual_seed(seed)
    theirs = make_torch().double()
    ours = make_pb()
    ours.load_state_dict(_state(theirs))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    return ours, theirs


def _data(seed: int, *shapes: tuple) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def _compare(ours, theirs, arrays, call_pb, call_torch, first_only=True) -> None:
    """Outputs, gradients of every input and every parameter, for sum(out * g)."""
    xs = [pb.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    got, want = call_pb(ours, *xs), call_torch(theirs, *ts)
    got, want = (got, want) if not first_only else (got[0], want[0])
    g = np.random.default_rng(9).standard_normal(tuple(want.shape))
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), **TOL)
    (got * pb.tensor(g)).sum().backward()
    (want * torch.tensor(g)).sum().backward()
    for x, t in zip(xs, ts, strict=True):
        if t.grad is not None:
            np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), **TOL)
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), theirs_params[name].grad.numpy(), **TOL,
                                   err_msg=name)


def _mha(**kw):
    return _twins(lambda: nn.MultiheadAttention(E, HEADS, dtype=np.float64, **kw),
                  lambda: torch.nn.MultiheadAttention(E, HEADS, **{"batch_first": True, **kw}))


# Row 1 of this mask hides keys 0 and 3 (True = not allowed, as PyTorch): read the
# other way round it would leave only those two.
HIDE = np.zeros((L, S), dtype=bool)
HIDE[1, [0, 3]] = True
HIDE[2, 4] = True
PADDING = np.array([[False, False, False, True, True], [False] * S])

MHA_CASES = {
    "self_attention_bool_mask": (dict(), "self", dict(attn_mask=HIDE[:, :L])),
    "cross_attention_float_mask_weights": (
        dict(), "cross", dict(attn_mask=_data(1, (L, S))[0], need_weights=True)),
    "key_padding_and_per_head_mask": (
        dict(), "cross", dict(key_padding_mask=PADDING,
                              attn_mask=np.broadcast_to(HIDE, (N * HEADS, L, S)).copy())),
    "sequence_first_no_bias_weights_per_head": (
        dict(batch_first=False, bias=False), "cross",
        dict(need_weights=True, average_attn_weights=False)),
}


@pytest.mark.parametrize("case", MHA_CASES)
def test_multihead_attention_matches_torch(case) -> None:
    kw, kind, call = MHA_CASES[case]
    ours, theirs = _mha(**kw)
    batch_first = kw.get("batch_first", True)
    shape = (lambda t: (N, t, E)) if batch_first else (lambda t: (t, N, E))
    pb_call = {k: (pb.tensor(v) if isinstance(v, np.ndarray) else v) for k, v in call.items()}
    torch_call = {k: (torch.tensor(v) if isinstance(v, np.ndarray) else v)
                  for k, v in call.items()}
    torch_call.setdefault("need_weights", False)
    if kind == "self":
        arrays = _data(2, shape(L))
        _compare(ours, theirs, arrays, lambda m, x: m(x, x, x, **pb_call),
                 lambda m, x: m(x, x, x, **torch_call))
    else:
        arrays = _data(2, shape(L), shape(S), shape(S))
        _compare(ours, theirs, arrays, lambda m, *x: m(*x, **pb_call),
                 lambda m, *x: m(*x, **torch_call))
    if call.get("need_weights"):
        q, k, v = (pb.tensor(a) for a in arrays)
        got = ours(q, k, v, **pb_call)[1]
        want = theirs(*(torch.tensor(a) for a in arrays), **torch_call)[1]
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), **TOL)


def test_multihead_attention_causal_without_a_mask_is_torchs_causal_mask() -> None:
    ours, theirs = _mha()
    (x,) = _data(3, (N, L, E))
    causal = torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)
    _compare(ours, theirs, [x], lambda m, x: m(x, x, x, is_causal=True),
             lambda m, x: m(x, x, x, attn_mask=causal, need_weights=False))


def test_multihead_attention_unbatched_input() -> None:
    ours, theirs = _mha()
    arrays = _data(4, (L, E), (S, E), (S, E))
    _compare(ours, theirs, arrays, lambda m, *x: m(*x), lambda m, *x: m(*x, need_weights=False))
    got = ours(*(pb.tensor(a) for a in arrays), need_weights=True)[1]
    want = theirs(*(torch.tensor(a) for a in arrays), need_weights=True)[1]
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), **TOL)


ENCODER_CASES = {
    "relu_post_norm_train_causal": (dict(), "train", True),
    "gelu_pre_norm_eval": (dict(activation="gelu", norm_first=True), "eval", False),
    "relu_sequence_first_eval": (dict(batch_first=False), "eval", False),
}


@pytest.mark.parametrize("case", ENCODER_CASES)
def test_transformer_encoder_layer_matches_torch_over_sgd_steps(case) -> None:
    kw, mode, causal = ENCODER_CASES[case]
    ours, theirs = _twins(
        lambda: nn.TransformerEncoderLayer(E, HEADS, 16, dropout=0.0, dtype=np.float64, **kw),
        lambda: torch.nn.TransformerEncoderLayer(E, HEADS, 16, dropout=0.0,
                                                 **{"batch_first": True, **kw}))
    getattr(ours, mode)(), getattr(theirs, mode)()
    mask = torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)
    pb_kw = dict(is_causal=True) if causal else {}
    torch_kw = dict(src_mask=mask, is_causal=True) if causal else {}
    shape = (L, N, E) if kw.get("batch_first") is False else (N, L, E)
    opt = optim.SGD(ours.parameters(), 0.1)
    topt = torch.optim.SGD(theirs.parameters(), 0.1)
    for step in range(3):
        (x,) = _data(10 + step, shape)
        opt.zero_grad(), topt.zero_grad()
        _compare(ours, theirs, [x], lambda m, x: m(x, **pb_kw), lambda m, x: m(x, **torch_kw),
                 first_only=False)
        opt.step(), topt.step()
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.numpy(), theirs_params[name].detach().numpy(), **TOL)


def test_encoder_layer_dropout_is_seeded_and_averages_to_eval() -> None:
    pb.manual_seed(100)  # the weights too: the test must not depend on the tests before it
    layer = nn.MultiheadAttention(E, HEADS, dropout=0.5, dtype=np.float64)
    (x,) = (pb.tensor(a) for a in _data(5, (1, 3, E)))

    def train_out(seed: int) -> np.ndarray:
        pb.manual_seed(seed)
        return layer(x, x, x)[0].numpy()

    np.testing.assert_array_equal(train_out(1), train_out(1))
    assert not np.allclose(train_out(1), train_out(2))
    # Dropout keeps the expectation: the mean of many training outputs is eval's output
    # within 5 standard errors, element by element.
    outs = np.array([train_out(seed) for seed in range(400)])
    standard_error = outs.std(axis=0) / np.sqrt(len(outs))
    layer.eval()
    eval_out = layer(x, x, x)[0].numpy()
    assert (np.abs(outs.mean(axis=0) - eval_out) < 5 * standard_error).all()


def test_encoder_layer_children_and_bad_activation() -> None:
    layer = nn.TransformerEncoderLayer(E, HEADS, 16)
    assert [name for name, _ in layer.named_children()] == [
        "self_attn", "linear1", "dropout", "linear2", "norm1", "norm2", "dropout1", "dropout2"]
    with pytest.raises(ValueError, match="activation must be one of"):
        nn.TransformerEncoderLayer(E, HEADS, activation="swish")
    with pytest.raises(ValueError, match="divisible by num_heads"):
        nn.MultiheadAttention(6, 4)
