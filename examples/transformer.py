"""Train a small character-level transformer, then generate from it.

The model is PyTorch's recipe under PyTorch's names: token and position
embeddings, pre-norm `nn.TransformerEncoderLayer`s under a causal mask, a final
`nn.LayerNorm` and a linear head. One training step (forward, loss, backward) is
lowered once to a TRAINING plan with `pb.compile` and replayed per batch; AdamW
applies the gradients the plan leaves in each parameter's `.grad`.
(`pullback train --model gpt` is the full-size job.)

Run: python examples/transformer.py [--steps N] [--width W] [--layers L]
"""

from __future__ import annotations

import argparse

import numpy as np

import pullback as pb
from pullback import nn, optim

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


class GPT(nn.Module):
    """Token and position embeddings, causal pre-norm encoder layers, a linear head."""

    def __init__(self, vocab: int, context: int, width: int, heads: int, layers: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                       activation="gelu", norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: pb.Tensor) -> pb.Tensor:  # (batch, time) integer ids
        x = self.tokens(ids) + self.positions(pb.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x, is_causal=True)
        return self.head(self.norm(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--context", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()

    chars = sorted(set(TEXT))
    data = np.array([chars.index(c) for c in TEXT])
    pb.manual_seed(0)
    model = GPT(len(chars), args.context, args.width, heads=2, layers=args.layers)
    opt = optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    rng = np.random.default_rng(0)

    def batch() -> tuple[np.ndarray, np.ndarray]:
        starts = rng.integers(0, len(data) - args.context - 1, args.batch)
        window = np.stack([data[s:s + args.context + 1] for s in starts])
        return window[:, :-1], window[:, 1:]

    def loss_fn(ids: pb.Tensor, targets: pb.Tensor) -> pb.Tensor:
        logits = model(ids)                                   # (N, T, C)
        return nn.cross_entropy(logits.permute(0, 2, 1), targets)  # (N, C, T), as PyTorch

    step = pb.compile(loss_fn, *batch(), mode=pb.LoweringMode.TRAINING)
    for i in range(args.steps):
        opt.zero_grad()
        loss = step(*batch())
        opt.step()
        if i % 50 == 0 or i == args.steps - 1:
            print(f"step {i}: loss {float(loss):.3f}")

    # Greedy generation, one character at a time, over the last `context` characters.
    model.eval()
    ids = [chars.index(c) for c in "the quick "]
    with pb.no_grad():
        for _ in range(30):
            window = pb.tensor(np.array([ids[-args.context:]]))
            ids.append(int(model(window)[0, -1].argmax()))
    print("sample:", "".join(chars[i] for i in ids))
    print(f"final loss: {float(loss):.3f}")


if __name__ == "__main__":
    main()
