"""Incremental decoding through `TransformerEncoderLayer`s: a cache of the keys and
values of the positions seen so far, and a layer step that runs only the new rows.

A decoder-only model (a stack of encoder layers under a causal mask) recomputes, at
every new token, the keys and values of every earlier position, which do not change.
`KVCache` keeps them, per layer, in one preallocated buffer; `encoder_layer_step`
runs new rows through one layer with its own parameters (no copies, so a cache never
sees stale weights), writes their keys and values into the buffer and attends over
the filled prefix. The maths is the layer's forward in eval mode (no dropout), row
by row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import ops
from ..tensor import Tensor, zeros
from .attention import MultiheadAttention
from .transformer import TransformerEncoderLayer


class KVCache:
    """Keys and values of up to `capacity` positions for `layers` layers of attention
    over `heads` heads of `head_dim` features, for a batch of `batch` sequences.

    `length` positions are filled (the same for every layer); `layer_step` appends. Each
    layer has one (2, batch, heads, capacity, head_dim) buffer, keys then values, so a
    step writes both with one assignment and nothing is concatenated."""

    def __init__(self, layers: int, batch: int, heads: int, capacity: int, head_dim: int,
                 dtype: Any = np.float32):
        self.capacity = capacity
        self.length = 0
        self.buffers = [zeros(2, batch, heads, capacity, head_dim, dtype=dtype)
                        for _ in range(layers)]

    def clear(self) -> None:
        """Forget every position (the buffers are kept and overwritten)."""
        self.length = 0


def encoder_layer_step(layer: TransformerEncoderLayer, x: Any, buffer: Tensor,
                       start: int) -> Tensor:
    """`layer` on (batch, T, E) `x`, the rows of positions start..start+T-1 attending to
    the cached positions 0..start-1 and causally among themselves; their keys and values
    are written into `buffer` (one of `KVCache.buffers`) at start..start+T-1. Equal to
    the rows start.. of `layer(all rows, is_causal=True)`, in eval mode."""
    if layer.training:
        raise ValueError("encoder_layer_step: cached decoding runs the layer as in eval mode "
                         "(no dropout); call model.eval() first")
    if layer.norm_first:
        x = ops.add(x, attention_step(layer.self_attn, layer.norm1(x), buffer, start))
        return ops.add(x, _feed_forward(layer, layer.norm2(x)))
    x = layer.norm1(ops.add(x, attention_step(layer.self_attn, x, buffer, start)))
    return layer.norm2(ops.add(x, _feed_forward(layer, x)))


def attention_step(attn: MultiheadAttention, x: Any, buffer: Tensor, start: int) -> Tensor:
    """Self-attention of (batch, T, E) `x` (positions start..start+T-1) over the cached
    keys and values and its own (causally), as `attn(x, x, x, is_causal=True)` gives for
    those rows when run over every position."""
    n, t, e = x.shape
    heads, head_dim = attn.num_heads, attn.head_dim
    stop = start + t
    if stop > buffer.shape[3]:
        raise ValueError(f"attention_step: positions {start}..{stop - 1} do not fit a cache "
                         f"of {buffer.shape[3]} positions")
    qkv = ops.matmul(x, ops.transpose(attn.in_proj_weight))
    if attn.in_proj_bias is not None:
        qkv = ops.add(qkv, attn.in_proj_bias)
    # (N, T, 3E) -> (3, N, heads, T, head_dim): queries, keys, values.
    qkv = ops.transpose(ops.reshape(qkv, (n, t, 3, heads, head_dim)), (2, 0, 3, 1, 4))
    buffer[:, :, :, start:stop] = qkv[1:]
    mask = None
    if t > 1:  # new row i sees every cached position and the new rows up to itself
        mask = np.tril(np.ones((t, stop), dtype=bool), start)
    out = ops.scaled_dot_product_attention(qkv[0], buffer[0, :, :, :stop],
                                           buffer[1, :, :, :stop], mask)
    return attn.out_proj(ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (n, t, e)))


def _feed_forward(layer: TransformerEncoderLayer, x: Any) -> Any:
    return layer.linear2(layer.activation(layer.linear1(x)))
