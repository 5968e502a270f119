"""`Embedding`: a lookup table of vectors indexed by integer ids, as PyTorch's.

Its forward is one `take` along the table's rows, whose gradient is a scatter-add of
the output's cotangent into the rows the ids picked (repeated ids accumulate). A
`padding_idx` row starts at zero and gets no gradient: the rows of the output that
read it are cut from the gradient, as PyTorch's embedding backward skips them.
"""

from __future__ import annotations

import numpy as np

from .. import ops
from ..ops.hints import DTypeLike, TensorLike
from ..tensor import Tensor, no_grad, randn
from .layers import check_sizes
from .module import Module, Parameter


class Embedding(Module):
    """y[..., :] = weight[input[...]], weight of shape (num_embeddings, embedding_dim)
    drawn from N(0, 1) as PyTorch draws it; ids out of range are a KernelError."""

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 padding_idx: int | None = None, dtype: DTypeLike = np.float32) -> None:
        super().__init__()
        check_sizes("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        if padding_idx is not None:
            if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, np.integer)) \
                    or not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx must be an int in "
                                 f"[{-num_embeddings}, {num_embeddings}), got {padding_idx!r}")
            padding_idx = int(padding_idx) % num_embeddings  # PyTorch keeps it non-negative
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = padding_idx
        self.weight = Parameter(randn(num_embeddings, embedding_dim, dtype=dtype))
        if padding_idx is not None:
            with no_grad():
                self.weight.numpy()[padding_idx] = 0.0

    def forward(self, input: TensorLike) -> Tensor:
        if not isinstance(input, (Tensor, np.ndarray)):
            input = np.asarray(input)  # a list of ids, or one id
        out = ops.take(self.weight, input, axis=0)
        if self.padding_idx is None:
            return out
        # The padding rows read the table's values but carry no gradient back to it.
        padded = ops.equal(input, self.padding_idx)
        padded = ops.reshape(padded, tuple(padded.shape) + (1,))
        return ops.where(padded, out.detach(), out)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"
