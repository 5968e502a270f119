"""TransformerEncoderLayer: self-attention and a feed-forward block, each with a residual
connection and a LayerNorm, as PyTorch's, with its child names (`self_attn`,
`linear1`, `dropout`, `linear2`, `norm1`, `norm2`, `dropout1`, `dropout2`) so that a
PyTorch state dict loads unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import ops
from ..ops.hints import DTypeLike
from ..tensor import Tensor
from .activations import Dropout
from .attention import Mask, MultiheadAttention
from .layers import Dense, LayerNorm
from .module import Module

#: The activations named by string, as PyTorch's ("gelu" is the exact, erf form).
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": ops.relu, "gelu": ops.gelu}


class TransformerEncoderLayer(Module):
    """x + attention, then x + feed-forward (linear2(dropout(activation(linear1(x))))),
    each followed by its LayerNorm (post-norm, PyTorch's default) or preceded by it
    (`norm_first=True`). `activation` is "relu", "gelu" or a function of a tensor."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: str | Callable[[Tensor], Tensor] = "relu",
                 batch_first: bool = True, norm_first: bool = False,
                 layer_norm_eps: float = 1e-5, dtype: DTypeLike = np.float32) -> None:
        super().__init__()
        if isinstance(activation, str):
            if activation not in ACTIVATIONS:
                raise ValueError(f"TransformerEncoderLayer: activation must be one of "
                                 f"{sorted(ACTIVATIONS)} or a function, not {activation!r}")
            activation = ACTIVATIONS[activation]
        elif not callable(activation):
            raise TypeError(f"TransformerEncoderLayer: activation must be a string or "
                            f"callable, not {type(activation).__name__}")
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout,
                                            batch_first=batch_first, dtype=dtype)
        self.linear1 = Dense(d_model, dim_feedforward, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Dense(dim_feedforward, d_model, dtype=dtype)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = activation
        self.norm_first = norm_first

    def forward(self, src: Tensor, src_mask: Mask | None = None, is_causal: bool = False, *,
                src_key_padding_mask: Mask | None = None) -> Tensor:
        """The layer on (N, T, E) `src` ((T, N, E) when batch_first is False); `src_mask`
        and `src_key_padding_mask` follow MultiheadAttention's conventions (True: not
        allowed), `is_causal` alone applies the causal mask."""
        x = src
        if self.norm_first:
            x = ops.add(x, self._attention(self.norm1(x), src_mask, is_causal,
                                           src_key_padding_mask))
            return ops.add(x, self._feed_forward(self.norm2(x)))
        x = self.norm1(ops.add(x, self._attention(x, src_mask, is_causal, src_key_padding_mask)))
        return self.norm2(ops.add(x, self._feed_forward(x)))

    def _attention(self, x: Tensor, mask: Mask | None, is_causal: bool, padding: Mask | None
                   ) -> Tensor:
        out, _ = self.self_attn(x, x, x, mask, is_causal, key_padding_mask=padding)
        return self.dropout1(out)

    def _feed_forward(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def extra_repr(self) -> str:
        name = getattr(self.activation, "__name__", repr(self.activation))
        return f"activation={name}, norm_first={self.norm_first}"
