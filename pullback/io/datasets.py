"""The bundled digits data, a fixed stratified train/test split, and seeded mini-batches.

Everything here is NumPy in, NumPy out and reads only the package's own data, so
the default training run needs no network and is reproducible from its seeds.
"""

from __future__ import annotations

import functools
import gzip
from collections.abc import Iterator
from importlib import resources

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

_DIGITS_FILE = "digits.csv.gz"
_DIGITS_ROWS, _PIXELS, _MAX_PIXEL, _CLASSES = 1797, 64, 16, 10


@functools.lru_cache(maxsize=1)
def _digits_table() -> np.ndarray:
    """The raw (1797, 65) integer table, parsed once per process and read-only."""
    with resources.files("pullback.data").joinpath(_DIGITS_FILE).open("rb") as raw, \
            gzip.open(raw, "rt") as text:
        table = np.loadtxt(text, delimiter=",", dtype=np.int64, ndmin=2)
    if table.shape != (_DIGITS_ROWS, _PIXELS + 1):
        raise RuntimeError(f"{_DIGITS_FILE}: expected {_DIGITS_ROWS} rows of 65 values, "
                           f"got shape {table.shape}; the package data is damaged")
    pixels, labels = table[:, :_PIXELS], table[:, _PIXELS]
    if pixels.min() < 0 or pixels.max() > _MAX_PIXEL or labels.min() < 0 \
            or labels.max() >= _CLASSES:
        raise RuntimeError(f"{_DIGITS_FILE}: values out of range; the package data is damaged")
    table.flags.writeable = False  # shared by every caller through the cache
    return table


def load_digits(dtype: DTypeLike = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 bundled 8x8 digits: images (1797, 1, 8, 8) in [0, 1], labels int64 0..9.

    Pixels (0..16 in the file) are divided by 16; `dtype` must be a float dtype.
    Each call returns fresh arrays, safe to modify.
    """
    resolved = np.dtype(dtype)
    if resolved.kind != "f":
        raise ValueError(f"load_digits: dtype must be a float dtype, got {resolved}")
    table = _digits_table()
    images = (table[:, :_PIXELS].astype(resolved) / resolved.type(_MAX_PIXEL)).reshape(
        -1, 1, 8, 8
    )
    return images, table[:, _PIXELS].copy()


def _check_pair(name: str, x: ArrayLike, y: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(f"{name}: x and y need a leading example axis, got shapes "
                         f"{x.shape} and {y.shape}")
    if len(x) != len(y):
        raise ValueError(f"{name}: x has {len(x)} examples but y has {len(y)}")
    return x, y


def train_test_split(
    x: ArrayLike,
    y: ArrayLike,
    test_fraction: float = 0.2,
    seed: int = 0,
    *,
    stratify: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split into (x_train, y_train, x_test, y_test), the same every call for a seed.

    The test set has test_fraction * n examples, rounded half up. With `stratify` (the
    default) each class of `y` contributes in proportion to its size (remainders
    go to the classes with the largest fractional share), so both sides see every
    class; otherwise the test set is a plain random sample. Within each side the
    examples keep their original order.
    """
    x, y = _check_pair("train_test_split", x, y)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"train_test_split: test_fraction must be in (0, 1), got {test_fraction}")
    n = len(x)
    n_test = int(test_fraction * n + 0.5)  # rounds half up, whatever float type arrives
    if not 0 < n_test < n:
        raise ValueError(f"train_test_split: {n} examples with test_fraction {test_fraction} "
                         f"leave {n_test} for testing and {n - n_test} for training")
    rng = np.random.default_rng(seed)
    if stratify:
        classes, class_of = np.unique(y, return_inverse=True)
        counts = np.bincount(class_of.reshape(-1), minlength=len(classes))
        quota = test_fraction * counts
        take = np.floor(quota).astype(np.int64)
        # Largest remainder: stable sort so ties go to the smaller class value.
        order = np.argsort(-(quota - take), kind="stable")
        take[order[: n_test - int(take.sum())]] += 1
        test_index = np.concatenate([
            rng.permutation(np.flatnonzero(class_of == c))[: take[c]]
            for c in range(len(classes))
        ])
    else:
        test_index = rng.permutation(n)[:n_test]
    is_test = np.zeros(n, dtype=bool)
    is_test[test_index] = True
    return x[~is_test], y[~is_test], x[is_test], y[is_test]


def batches(
    x: ArrayLike,
    y: ArrayLike,
    batch_size: int,
    *,
    shuffle: bool = True,
    rng: np.random.Generator | int | None = None,
    drop_last: bool = False,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (x_batch, y_batch) NumPy arrays covering every example once (one epoch).

    With `shuffle`, the order is a permutation drawn from `rng` when `batches` is
    called: pass one Generator for a whole run so each epoch differs yet the run
    is reproducible, or an int seed; None draws from fresh OS entropy. The last
    batch may be smaller unless `drop_last`. Arguments are checked at the call.
    """
    x, y = _check_pair("batches", x, y)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size <= 0:
        raise ValueError(f"batches: batch_size must be a positive int, got {batch_size!r}")
    if rng is not None and not isinstance(rng, (np.random.Generator, int, np.integer)):
        raise TypeError(f"batches: rng must be a np.random.Generator, an int seed or None, "
                        f"got {type(rng).__name__}")
    n = len(x)
    # Drawn now, not at the first next(), so the rng advances at a predictable time.
    order = np.random.default_rng(rng).permutation(n) if shuffle else np.arange(n)
    stop = n - n % batch_size if drop_last else n
    return _batches(x, y, order, int(batch_size), stop)


def _batches(
    x: np.ndarray, y: np.ndarray, order: np.ndarray, batch_size: int, stop: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for start in range(0, stop, batch_size):
        index = order[start : start + batch_size]
        yield x[index], y[index]


def digits_split(
    test_fraction: float = 0.2, seed: int = 0, dtype: DTypeLike = np.float32
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`load_digits` then a stratified `train_test_split`: the default job's data."""
    images, labels = load_digits(dtype)
    return train_test_split(images, labels, test_fraction=test_fraction, seed=seed)


__all__ = ["batches", "digits_split", "load_digits", "train_test_split"]
