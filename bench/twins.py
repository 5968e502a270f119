"""pullback.gpt's GPT as a PyTorch module for the benchmarks: torch.nn layers under
pullback's child names (the state dicts match key for key), with a cached step for
generation. Import it after `common.pin_threads` (it imports torch)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


class TorchGPT(torch.nn.Module):
    """Token and position embeddings, pre-norm causal encoder layers (GELU, no
    dropout), a final LayerNorm and a linear head, as pullback.gpt.GPT."""

    def __init__(self, vocab: int, context: int, width: int, heads: int, layers: int):
        super().__init__()
        self.context, self.width, self.heads = context, width, heads
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

    def new_cache(self) -> list[torch.Tensor]:
        """Per layer a (2, 1, heads, context, head_dim) buffer of keys and values."""
        shape = (2, 1, self.heads, self.context, self.width // self.heads)
        return [torch.zeros(shape) for _ in self.blocks]

    def step(self, ids: torch.Tensor, cache: list[torch.Tensor], start: int) -> torch.Tensor:
        """The rows of positions start.. of `forward`, their keys and values written into
        `cache`, attending over it."""
        n, t = ids.shape
        stop, head_dim = start + t, self.width // self.heads
        x = self.tokens(ids) + self.positions(torch.arange(start, stop))
        mask = None if t == 1 else torch.ones(t, stop, dtype=torch.bool).tril(start)
        for block, buffer in zip(self.blocks, cache):
            attn = block.self_attn
            qkv = F.linear(block.norm1(x), attn.in_proj_weight, attn.in_proj_bias)
            qkv = qkv.view(n, t, 3, self.heads, head_dim).permute(2, 0, 3, 1, 4)
            buffer[:, :, :, start:stop] = qkv[1:]
            out = F.scaled_dot_product_attention(qkv[0], buffer[0, :, :, :stop],
                                                 buffer[1, :, :, :stop], attn_mask=mask)
            x = x + attn.out_proj(out.transpose(1, 2).reshape(n, t, self.width))
            x = x + block.linear2(F.gelu(block.linear1(block.norm2(x))))
        return self.head(self.norm(x))


def twin_of(model: Any) -> TorchGPT:
    """A TorchGPT of `model`'s sizes holding copies of its weights, loaded strictly
    (every name must match)."""
    vocab, width = model.tokens.weight.shape
    twin = TorchGPT(vocab, model.context, width, model.blocks[0].self_attn.num_heads,
                    len(model.blocks))
    twin.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                          for k, v in model.state_dict().items()})
    return twin
