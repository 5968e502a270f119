"""Each process's part of the data: `shard` splits indices (a global batch) into
disjoint contiguous parts, one per process, and `epoch_order` is an epoch's shuffled
order of the samples, the same on every process without any communication."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .comm import group


def shard(indices: ArrayLike) -> NDArray[Any]:
    """This process's part of `indices` (a global batch, or a whole epoch's order): the
    parts of all processes are disjoint, cover `indices`, keep its order, and differ in
    length by at most one. Averaged gradients equal one process's gradient on the whole
    batch exactly when its length is a multiple of `size()`."""
    where = "pullback.distributed.shard"
    g = group(where)
    items = np.asarray(indices)
    if items.ndim != 1:
        raise ValueError(f"{where}: expected a 1-d sequence of indices, got shape {items.shape}")
    n = len(items)
    if n < g.size:
        raise ValueError(f"{where}: {n} indices for {g.size} processes; each process needs at "
                         f"least one sample: use a batch of at least {g.size} (a multiple of "
                         f"{g.size} keeps the averaged gradient exact)")
    return items[g.rank * n // g.size:(g.rank + 1) * n // g.size]


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order in which epoch `epoch` visits samples 0..n-1: a permutation drawn from
    (seed, epoch), identical on every process. Cut it into global batches and `shard`
    each one."""
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"pullback.distributed.epoch_order: n must be an integer >= 0, got "
                         f"{n!r}")
    return np.random.default_rng([int(seed), int(epoch)]).permutation(int(n))
