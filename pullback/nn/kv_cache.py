"""Incremental decoding through `TransformerEncoderLayer`s: a cache of the keys and
values of the positions seen so far, and a layer step that runs only the new rows.

A decoder-only model (a stack of encoder layers under a causal mask) would otherwise
recompute, for every new token, the keys and values of every earlier position, which
do not change. `KVCache` keeps them in preallocated buffers; `encoder_layer_step` runs
new rows through one layer with the layer's own parameters (nothing is copied, so a
cache never holds stale weights), writes their projections into the buffer and
attends over the positions filled so far (a mask hides the others): the layer's
forward in eval mode (no dropout), row by row.

A new token is a (1, 1, E) row, so a step costs what its ops' Python overhead costs,
not arithmetic: the buffer's layout is chosen so a step needs no reshapes, transposes
or concatenations to file its keys and values, nor copies of the cache to read them
back (see `LayerCache`), and each weight is transposed once per cache, not per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .. import ops
from ..ops.hints import DTypeLike
from ..tensor import Tensor, from_numpy, no_grad
from .attention import MultiheadAttention
from .layers import Dense
from .transformer import TransformerEncoderLayer


@dataclass(frozen=True)
class LayerCache:
    """One layer's buffer, (batch, capacity, 3, heads, head_dim): per position its query,
    key and value in the order the in-projection computes them, seen four ways (views
    of the same memory). A step writes its rows of the projection into `rows` in one
    assignment and reads back the heads attention wants, without moving data."""

    rows: Tensor  # (batch, capacity, 3 * heads * head_dim): where projections are written
    queries: Tensor  # (batch, heads, capacity, head_dim)
    keys_t: Tensor  # (batch, heads, head_dim, capacity): transposed, as the scores need it
    values: Tensor  # (batch, heads, capacity, head_dim)

    @classmethod
    def empty(cls, batch: int, heads: int, capacity: int, head_dim: int,
              dtype: DTypeLike) -> LayerCache:
        data = np.zeros((batch, capacity, 3, heads, head_dim), dtype)
        return cls(from_numpy(data.reshape(batch, capacity, 3 * heads * head_dim)),
                   from_numpy(data[:, :, 0].transpose(0, 2, 1, 3)),
                   from_numpy(data[:, :, 1].transpose(0, 2, 3, 1)),
                   from_numpy(data[:, :, 2].transpose(0, 2, 1, 3)))


class KVCache:
    """The keys and values of up to `capacity` positions for `layers` layers of attention
    over `heads` heads of `head_dim` features, for a batch of `batch` sequences.

    `length` positions are filled, the same in every layer: `encoder_layer_step` writes
    the positions from `length` on, and the model advances `length` after its last
    layer. (The queries are kept too, since the projection yields all three in one
    piece; only the new rows' are read.)"""

    def __init__(self, layers: int, batch: int, heads: int, capacity: int, head_dim: int,
                 dtype: DTypeLike = np.float32) -> None:
        self.capacity = capacity
        self.length = 0
        self.layers = [LayerCache.empty(batch, heads, capacity, head_dim, dtype)
                       for _ in range(layers)]
        # Row p: 0 for the positions p may attend to (0..p), -inf for the others.
        seen = np.tril(np.ones((capacity, capacity), dtype=bool))
        self.causal_mask = np.where(seen, 0.0, -np.inf).astype(dtype)
        self._transposed: dict[int, tuple[Tensor, NDArray[Any], Tensor]] = {}

    def clear(self) -> None:
        """Forget every position. The buffers are zeroed, not dropped: attention weighs
        the unfilled positions by exactly zero, and zero times what a previous window
        left there could be NaN."""
        self.length = 0
        with no_grad():
            for layer in self.layers:
                layer.rows[...] = 0.0

    def transposed(self, weight: Tensor) -> Tensor:
        """weight.T, as a view made once per array of weights rather than once per step
        (a transpose costs a step as much as the matmul reading it): updates in place
        show through it, and a parameter given a new array gets a new view."""
        data = weight.numpy()
        known = self._transposed.get(id(weight))
        # The entry holds the weight itself, so its id names no other tensor meanwhile.
        if known is None or known[1] is not data:
            known = self._transposed[id(weight)] = (weight, data, ops.transpose(weight))
        return known[2]


def encoder_layer_step(layer: TransformerEncoderLayer, x: Tensor, cache: KVCache,
                       index: int) -> Tensor:
    """`layer` on (batch, T, E) `x`, the rows of positions cache.length.. attending to the
    cached positions before them and causally among themselves; their keys and values
    are written into the cache's layer `index`. Equal to those rows of
    `layer(all rows, is_causal=True)` in eval mode. Inference only: nothing is recorded
    (the cache is written in place), so the result carries no gradient."""
    if layer.training:
        raise ValueError("encoder_layer_step: cached decoding runs the layer as in eval mode "
                         "(no dropout); call model.eval() first")
    with no_grad():
        if layer.norm_first:
            x = ops.add(x, attention_step(layer.self_attn, layer.norm1(x), cache, index))
            return ops.add(x, _feed_forward(layer, layer.norm2(x), cache))
        x = layer.norm1(ops.add(x, attention_step(layer.self_attn, x, cache, index)))
        return layer.norm2(ops.add(x, _feed_forward(layer, x, cache)))


def attention_step(attn: MultiheadAttention, x: Tensor, cache: KVCache, index: int) -> Tensor:
    """Self-attention of (batch, T, E) `x` (positions cache.length..) over the cached
    keys and values and its own (causally), as `attn(x, x, x, is_causal=True)` gives for
    those rows when run over every position; their projections go into layer `index`."""
    n, t, e = x.shape
    start, stop, buffer = cache.length, cache.length + t, cache.layers[index]
    if stop > cache.capacity:
        raise ValueError(f"attention_step: positions {start}..{stop - 1} do not fit a cache "
                         f"of {cache.capacity} positions")
    qkv = ops.matmul(x, cache.transposed(attn.in_proj_weight))
    if attn.in_proj_bias is not None:
        qkv = ops.add(qkv, attn.in_proj_bias)
    buffer.rows[:, start:stop] = qkv
    # Written out rather than the fused scaled_dot_product_attention: for a few query
    # rows its blocking buys nothing and its checks cost more than these ops. Every
    # row scores all `capacity` positions, the mask hiding those past its own (the
    # unfilled ones among them): slicing the filled prefix would copy it each step.
    q = ops.mul(buffer.queries[:, :, start:stop], 1.0 / math.sqrt(attn.head_dim))
    scores = ops.add(ops.matmul(q, buffer.keys_t), cache.causal_mask[start:stop])
    out = ops.matmul(ops.softmax(scores, -1), buffer.values)  # (N, heads, T, head_dim)
    if t > 1:  # -> (N, T, heads, head_dim); a no-op for T = 1
        out = ops.transpose(out, (0, 2, 1, 3))
    return dense_step(attn.out_proj, ops.reshape(out, (n, t, e)), cache)


def dense_step(dense: Dense, x: Tensor, cache: KVCache) -> Tensor:
    """`dense(x)`, its weight transposed once per cache (`KVCache.transposed`)."""
    y = ops.matmul(x, cache.transposed(dense.weight))
    return y if dense.bias is None else ops.add(y, dense.bias)


def _feed_forward(layer: TransformerEncoderLayer, x: Tensor, cache: KVCache) -> Tensor:
    return dense_step(layer.linear2, layer.activation(dense_step(layer.linear1, x, cache)),
                      cache)
