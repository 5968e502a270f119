"""MultiheadAttention: PyTorch's layer, its parameter names and its mask conventions, over
`scaled_dot_product_attention`.

PyTorch's masks here are the opposite of scaled_dot_product_attention's: a bool
`attn_mask` or `key_padding_mask` marks what may NOT be attended to (True), and a
float one is added to the scores. Both become one additive bias. As in PyTorch, the
attention weights are computed explicitly only when asked for (`need_weights=True`,
where a row with every key masked gives NaN, as PyTorch's does); otherwise the fused
primitive runs (such a row gives zeros).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .. import ops
from ..ops.hints import DTypeLike
from ..tensor import Tensor, zeros
from ..tensor.creation import default_generator
from .layers import Dense, check_sizes, uniform
from .module import Module, Parameter

NEG_INF = -math.inf

# A mask as PyTorch's layer takes it: bool (True: not allowed) or float (added), a tensor
# or an array.
Mask = Tensor | NDArray[Any]


class MultiheadAttention(Module):
    """Attention over `num_heads` heads of embed_dim // num_heads features, as PyTorch's
    nn.MultiheadAttention: `in_proj_weight` (3E, E) and `in_proj_bias` (3E,) project
    query, key and value; `out_proj` (a Dense) mixes the heads back. Initialized as
    PyTorch does (Xavier-uniform in-projection, zero biases)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = True, dtype: DTypeLike = np.float32) -> None:
        super().__init__()
        check_sizes("MultiheadAttention", embed_dim=embed_dim, num_heads=num_heads)
        if num_heads == 0 or embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim {embed_dim} must be divisible by "
                             f"num_heads {num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MultiheadAttention: dropout must be in [0, 1), not {dropout}")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        # Xavier-uniform over the (3E, E) matrix, as PyTorch's _reset_parameters.
        self.in_proj_weight = uniform((3 * embed_dim, embed_dim),
                                      math.sqrt(6.0 / (4 * embed_dim)) if embed_dim else 0.0,
                                      dtype)
        self.in_proj_bias = Parameter(zeros(3 * embed_dim, dtype=dtype)) if bias else None
        self.out_proj = Dense(embed_dim, embed_dim, bias=bias, dtype=dtype)
        if bias:
            self.out_proj.bias = Parameter(zeros(embed_dim, dtype=dtype))

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attn_mask: Mask | None = None,
                is_causal: bool = False, need_weights: bool = False, *,
                key_padding_mask: Mask | None = None, average_attn_weights: bool = True
                ) -> tuple[Tensor, Tensor | None]:
        """(output, weights or None) for (N, L, E) query and (N, S, E) key and value
        ((L, N, E) and (S, N, E) when batch_first is False; (L, E) and (S, E) unbatched).
        `attn_mask` (L, S) or (N * num_heads, L, S), `key_padding_mask` (N, S): True
        or -inf where attention is not allowed. `is_causal` alone applies the causal
        mask; with `attn_mask` it says that mask is causal (as in PyTorch). The weights
        are averaged over heads unless `average_attn_weights` is False."""
        batched = len(query.shape) == 3
        if batched and not self.batch_first:
            query, key, value = (ops.transpose(x, (1, 0, 2)) for x in (query, key, value))
        elif not batched:
            query, key, value = (ops.reshape(x, (1, *x.shape)) for x in (query, key, value))
        n, length, _ = query.shape
        keys = key.shape[1]
        q, k, v = (self._heads(x) for x in self._project(query, key, value))
        bias, causal = self._bias(attn_mask, key_padding_mask, is_causal, need_weights,
                                  n, length, keys, query.dtype)
        p = self.dropout if self.training else 0.0
        weights: Tensor | None = None
        if need_weights:
            weights = self._weights(q, k, bias, causal, p)
            out = ops.matmul(weights, v)
            weights = ops.mean(weights, 1) if average_attn_weights else weights
        else:
            out = ops.scaled_dot_product_attention(q, k, v, bias, p, causal)
        out = self.out_proj(ops.reshape(ops.transpose(out, (0, 2, 1, 3)),
                                        (n, length, self.embed_dim)))
        if not batched:
            out = ops.reshape(out, out.shape[1:])
            weights = None if weights is None else ops.reshape(weights, weights.shape[1:])
        elif not self.batch_first:
            out = ops.transpose(out, (1, 0, 2))
        return out, weights

    def _project(self, query: Tensor, key: Tensor, value: Tensor
                 ) -> tuple[Tensor, Tensor, Tensor]:
        """query, key and value through their thirds of the in-projection: three
        matmuls, self-attention too. One (N, T, 3E) product cut in three costs more
        than it saves: copies of the thirds forward, and backward three (N, T, 3E)
        zero-filled gradients summed (about 5 ms a layer at the GPT bench's size)."""
        e, w, b = self.embed_dim, self.in_proj_weight, self.in_proj_bias
        projected = []
        for i, x in enumerate((query, key, value)):
            y = ops.matmul(x, ops.transpose(w[i * e:(i + 1) * e]))
            projected.append(y if b is None else ops.add(y, b[i * e:(i + 1) * e]))
        q, k, v = projected
        return q, k, v

    def _heads(self, x: Tensor) -> Tensor:
        """(N, T, E) -> (N, heads, T, head_dim)."""
        n, t, _ = x.shape
        return ops.transpose(ops.reshape(x, (n, t, self.num_heads, self.head_dim)), (0, 2, 1, 3))

    def _bias(self, attn_mask: Mask | None, key_padding_mask: Mask | None, is_causal: bool,
              need_weights: bool, n: int, length: int, keys: int, dtype: DTypeLike
              ) -> tuple[Mask | None, bool]:
        """The masks as one additive bias broadcasting to (N, heads, L, S), and whether
        the causal mask is left to the fused op instead."""
        if is_causal and key_padding_mask is None and not need_weights:
            return None, True  # PyTorch too takes the hint over the mask here
        if is_causal and attn_mask is None:
            attn_mask = np.triu(np.ones((length, keys), dtype=bool), 1)
        bias: Mask | None = None
        if attn_mask is not None:
            bias = _as_bias(attn_mask, dtype, "attn_mask")
            if len(bias.shape) == 3:  # (N * heads, L, S)
                bias = ops.reshape(bias, (n, self.num_heads, length, keys))
        if key_padding_mask is not None:
            padding = ops.reshape(_as_bias(key_padding_mask, dtype, "key_padding_mask"),
                                  (n, 1, 1, keys))
            bias = padding if bias is None else ops.add(bias, padding)
        return bias, False

    def _weights(self, q: Tensor, k: Tensor, bias: Mask | None, causal: bool, p: float
                 ) -> Tensor:
        """softmax(q k^T / sqrt(head_dim) + bias), dropped out in training, explicitly."""
        scores = ops.matmul(ops.mul(q, 1.0 / math.sqrt(self.head_dim)), ops.swap_last(k))
        if bias is not None:
            scores = ops.add(scores, bias)
        weights = ops.softmax(scores, -1)
        if p > 0.0:
            weights = ops.mul(weights, ops.dropout_mask(weights, p, default_generator))
        return weights

    def extra_repr(self) -> str:
        return (f"{self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
                f"bias={self.in_proj_bias is not None}, batch_first={self.batch_first}")


def _as_bias(mask: Mask, dtype: DTypeLike, name: str) -> Mask:
    """A PyTorch-convention mask (bool True: not allowed; float: added) as a float bias."""
    mask_dtype = str(getattr(mask, "dtype", ""))
    if mask_dtype == "bool":
        return ops.astype(ops.where(mask, NEG_INF, 0.0), dtype)
    if mask_dtype != str(np.dtype(dtype)):
        raise TypeError(f"MultiheadAttention: {name} must be bool or {np.dtype(dtype)}, "
                        f"not {mask_dtype or type(mask).__name__}")
    return mask
