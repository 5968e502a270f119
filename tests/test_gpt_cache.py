"""Cached decoding (`GPT.step`, `pullback.nn.kv_cache`) against full forwards, written
here, and against PyTorch's TransformerEncoderLayer with the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gpt_twin import twin_of

import pullback as pb
from pullback import nn
from pullback.gpt import GPT, generate
from pullback.nn.kv_cache import KVCache, encoder_layer_step

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 11, 8, 16, 2, 2
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def model() -> GPT:
    pb.manual_seed(0)
    gpt = GPT(VOCAB, CONTEXT, WIDTH, HEADS, LAYERS)
    gpt.eval()
    return gpt


def _full(model: GPT, ids: list[int]) -> np.ndarray:
    """The last position's logits from a forward over all of `ids`."""
    with pb.no_grad():
        return model(pb.tensor(np.asarray(ids, np.int64)[None])).numpy()[0, -1]


def test_cached_logits_equal_a_full_forward_at_every_position_and_after_a_restart(
        model: GPT) -> None:
    ids = np.random.default_rng(0).integers(0, VOCAB, 2 * CONTEXT).tolist()
    cache = model.new_cache()
    with pb.no_grad():
        # Three rows at once into an empty cache, then two at once after them (the
        # causal mask offset by the cached positions), then one at a time.
        chunks = [(0, 3), (3, 5)] + [(i, i + 1) for i in range(5, CONTEXT)]
        for start, stop in chunks:
            logits = model.step(np.asarray([ids[start:stop]]), cache).numpy()[0]
            for row, end in enumerate(range(start + 1, stop + 1)):
                np.testing.assert_allclose(logits[row], _full(model, ids[:end]),
                                           rtol=RTOL, atol=ATOL, err_msg=f"position {end - 1}")
        assert cache.length == CONTEXT
        with pytest.raises(ValueError, match="exceed the context of 8"):
            model.step(np.asarray([ids[CONTEXT:CONTEXT + 1]]), cache)
        # Restarted from the last ids, at positions 0..: the window's own forward.
        cache.clear()
        window = ids[CONTEXT - 3:CONTEXT + 4]
        logits = model.step(np.asarray([window[:5]]), cache).numpy()[0, -1]
        np.testing.assert_allclose(logits, _full(model, window[:5]), rtol=RTOL, atol=ATOL)
        for end in (6, 7):
            logits = model.step(np.asarray([window[end - 1:end]]), cache).numpy()[0, -1]
            np.testing.assert_allclose(logits, _full(model, window[:end]), rtol=RTOL,
                                       atol=ATOL)


def _greedy_reference(model: GPT, prompt: list[int], tokens: int) -> list[int]:
    """Greedy ids from full forwards over generate's documented window: the last
    `context` ids of the prompt, restarting at the last context // 2 when it is full."""
    ids = list(prompt)
    start = max(0, len(ids) - CONTEXT)
    for _ in range(tokens):
        if len(ids) - start > CONTEXT:
            start = len(ids) - CONTEXT // 2
        ids.append(int(_full(model, ids[start:]).argmax()))
    return ids


@pytest.mark.parametrize("prompt", [[3], list(range(1, VOCAB)) + [0]])  # short; > context
def test_greedy_generate_gives_the_ids_of_full_forwards(model: GPT, prompt: list[int]) -> None:
    rng = np.random.default_rng(0)
    got = generate(model, prompt, 3 * CONTEXT, temperature=0, rng=rng)
    assert got == _greedy_reference(model, prompt, 3 * CONTEXT)
    assert len(set(got[len(prompt):])) > 1  # not a degenerate model repeating one id


def test_cached_steps_match_pytorch_with_the_same_weights(model: GPT) -> None:
    twin = twin_of(model.state_dict(), VOCAB, CONTEXT, WIDTH, HEADS, LAYERS).eval()
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, CONTEXT))  # a batch of two
    with torch.no_grad():
        expected = twin(torch.from_numpy(ids)).numpy()
    cache = model.new_cache(batch=2)
    with pb.no_grad():
        got = np.concatenate([model.step(ids[:, i:i + 1], cache).numpy()
                              for i in range(CONTEXT)], 1)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_a_post_norm_layer_steps_as_pytorch_and_training_mode_is_refused() -> None:
    pb.manual_seed(1)
    layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 32, dropout=0.0).eval()
    twin = torch.nn.TransformerEncoderLayer(WIDTH, HEADS, 32, dropout=0.0,
                                            batch_first=True).eval()
    twin.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                          for k, v in layer.state_dict().items()})
    x = np.random.default_rng(2).standard_normal((1, 5, WIDTH)).astype(np.float32)
    with torch.no_grad():
        expected = twin(torch.from_numpy(x), is_causal=True,
                        src_mask=torch.nn.Transformer.generate_square_subsequent_mask(5)).numpy()
    cache = KVCache(1, 1, HEADS, 5, WIDTH // HEADS)
    with pb.no_grad():
        first = encoder_layer_step(layer, x[:, :2], cache, 0).numpy()
        cache.length = 2
        got = np.concatenate([first, encoder_layer_step(layer, x[:, 2:], cache, 0).numpy()], 1)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        layer.train()
        with pytest.raises(ValueError, match="eval mode"):
            encoder_layer_step(layer, x[:, :1], cache, 0)


def test_a_cache_sees_weights_updated_in_place_and_replaced() -> None:
    pb.manual_seed(2)
    gpt = GPT(VOCAB, CONTEXT, WIDTH, HEADS, 1).eval()
    ids = [1, 2, 3]
    cache = gpt.new_cache()
    with pb.no_grad():
        gpt.step(np.asarray([ids[:2]]), cache)  # transposes the weights it reads
        gpt.blocks[0].linear2.weight.numpy()[...] *= 0.5  # in place
        gpt.blocks[0].linear1.weight = nn.Parameter(pb.randn(4 * WIDTH, WIDTH))  # replaced
        gpt.to(np.float64)  # every parameter given a new array, then another
        gpt.head.weight.numpy()[...] *= 2.0
        gpt.to(np.float32)
        cache.clear()
        logits = gpt.step(np.asarray([ids]), cache).numpy()[0, -1]
    np.testing.assert_allclose(logits, _full(gpt, ids), rtol=RTOL, atol=ATOL)
    # Outside no_grad too nothing is recorded: the cache is written in place, so a
    # gradient through it would miss the cached positions' share.
    cache.clear()
    assert not gpt.step(np.asarray([ids]), cache).requires_grad
