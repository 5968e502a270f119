"""pullback.gpt's GPT as a PyTorch module (torch.nn layers under pullback's child names,
so the state dicts match key for key), shared by the tests that compare the two."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class TorchGPT(torch.nn.Module):
    """Token and position embeddings, pre-norm causal encoder layers (GELU, no
    dropout), a final LayerNorm and a linear head, as pullback.gpt.GPT."""

    def __init__(self, vocab: int, context: int, width: int, heads: int, layers: int):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, width)
        self.positions = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                             activation="gelu", batch_first=True,
                                             norm_first=True)
            for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(t))
        mask = torch.nn.Transformer.generate_square_subsequent_mask(t)
        for block in self.blocks:
            x = block(x, src_mask=mask, is_causal=True)
        return self.head(self.norm(x))


def twin_of(weights: dict[str, Any], vocab: int, context: int, width: int, heads: int,
            layers: int) -> TorchGPT:
    """A TorchGPT holding copies of `weights` (a state dict of arrays or tensors with
    `.numpy()`), loaded strictly: every name must match."""
    twin = TorchGPT(vocab, context, width, heads, layers)
    twin.load_state_dict({k: torch.from_numpy(np.array(v.numpy() if hasattr(v, "numpy") else v))
                          for k, v in weights.items()})
    return twin
