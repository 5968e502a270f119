"""The bundled digits data, the fixed stratified split, and seeded mini-batches."""

from __future__ import annotations

import numpy as np
import pytest

from pullback.io import batches, digits_split, load_digits, train_test_split

N = 1797


def test_digits_shapes_dtypes_and_ranges() -> None:
    images, labels = load_digits()
    assert images.shape == (N, 1, 8, 8) and images.dtype == np.float32
    assert labels.shape == (N,) and labels.dtype == np.int64
    assert images.min() == 0.0 and images.max() == 1.0
    np.testing.assert_array_equal(images * 16, np.round(images * 16))  # steps of 1/16


def test_digits_float64_and_bad_dtype() -> None:
    images, _ = load_digits(np.float64)
    assert images.dtype == np.float64
    with pytest.raises(ValueError, match="float dtype"):
        load_digits(np.int32)


def test_digits_has_about_180_of_each_label() -> None:
    _, labels = load_digits()
    counts = np.bincount(labels)
    assert len(counts) == 10 and counts.sum() == N
    assert counts.min() >= 170 and counts.max() <= 190


def test_digits_returns_fresh_arrays() -> None:
    images, labels = load_digits()
    images[:] = -1.0
    labels[:] = -1
    again_images, again_labels = load_digits()
    assert again_images.min() == 0.0 and again_labels.min() == 0


def test_split_sizes_and_disjoint_cover() -> None:
    x, y = np.arange(N), load_digits()[1]
    x_train, y_train, x_test, y_test = train_test_split(x, y)
    assert len(x_test) == len(y_test) == 359 and len(x_train) == len(y_train) == 1438
    np.testing.assert_array_equal(np.sort(np.concatenate([x_train, x_test])), x)
    np.testing.assert_array_equal(y_train, y[x_train])  # rows stay paired
    np.testing.assert_array_equal(y_test, y[x_test])


def test_split_is_stratified() -> None:
    _, labels = load_digits()
    *_, y_test = train_test_split(np.arange(N), labels)
    assert np.all(np.abs(np.bincount(y_test, minlength=10) - 0.2 * np.bincount(labels)) < 1)


def test_split_without_stratify_has_the_same_sizes() -> None:
    _, labels = load_digits()
    x_train, _, x_test, _ = train_test_split(np.arange(N), labels, stratify=False)
    assert len(x_train) == 1438 and len(x_test) == 359


def test_split_is_fixed_per_seed_and_differs_between_seeds() -> None:
    _, labels = load_digits()
    first = train_test_split(np.arange(N), labels, seed=0)
    second = train_test_split(np.arange(N), labels, seed=0)
    other = train_test_split(np.arange(N), labels, seed=1)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[2], other[2])


def test_digits_split_matches_the_manual_path() -> None:
    images, labels = load_digits()
    for a, b in zip(digits_split(), train_test_split(images, labels)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("x", "y", "fraction", "match"), [
    (np.zeros(10), np.zeros(9), 0.2, "x has 10 examples but y has 9"),
    (np.zeros(10), np.zeros(10), 0.0, "test_fraction must be in"),
    (np.zeros(10), np.zeros(10), 1.0, "test_fraction must be in"),
    (np.zeros(2), np.zeros(2), 0.1, "leave 0 for testing"),
    (np.float32(1), np.zeros(1), 0.5, "leading example axis"),
], ids=["lengths", "zero", "one", "too-few", "scalar"])
def test_split_rejects_bad_arguments(x: np.ndarray, y: np.ndarray, fraction: float,
                                     match: str) -> None:
    with pytest.raises(ValueError, match=match):
        train_test_split(x, y, test_fraction=fraction)


def _epoch_order(batch_size: int = 64, **kwargs: object) -> list[np.ndarray]:
    x = np.arange(N)
    return [xb for xb, _ in batches(x, x * 10, batch_size, **kwargs)]


def test_batches_cover_every_example_once_with_paired_labels() -> None:
    x = np.arange(N)
    seen = []
    for xb, yb in batches(x, x * 10, 64, rng=np.random.default_rng(0)):
        np.testing.assert_array_equal(yb, xb * 10)
        seen.append(xb)
    assert [len(b) for b in seen] == [64] * 28 + [N - 28 * 64]
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), x)


def test_batches_of_images_keep_their_shape() -> None:
    images, labels = load_digits()
    xb, yb = next(iter(batches(images, labels, 32, rng=0)))
    assert xb.shape == (32, 1, 8, 8) and xb.dtype == np.float32
    assert yb.shape == (32,) and yb.dtype == np.int64


def test_drop_last_drops_only_the_short_batch() -> None:
    order = _epoch_order(64, rng=0, drop_last=True)
    assert [len(b) for b in order] == [64] * 28
    assert len(np.unique(np.concatenate(order))) == 28 * 64


def test_no_shuffle_keeps_the_data_order() -> None:
    np.testing.assert_array_equal(np.concatenate(_epoch_order(100, shuffle=False)), np.arange(N))


def test_batches_are_reproducible_per_seed_and_differ_between_seeds() -> None:
    first = np.concatenate(_epoch_order(rng=np.random.default_rng(5)))
    again = np.concatenate(_epoch_order(rng=np.random.default_rng(5)))
    as_int = np.concatenate(_epoch_order(rng=5))
    other = np.concatenate(_epoch_order(rng=np.random.default_rng(6)))
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, as_int)
    assert not np.array_equal(first, other)
    assert not np.array_equal(first, np.arange(N))


def test_one_generator_gives_different_epochs_and_a_reproducible_run() -> None:
    def run(seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [np.concatenate(_epoch_order(rng=rng)) for _ in range(3)]

    epochs = run(0)
    assert not np.array_equal(epochs[0], epochs[1])
    for a, b in zip(epochs, run(0)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("batch_size", "match"), [
    (0, "batch_size must be a positive int"),
    (-3, "batch_size must be a positive int"),
    (2.5, "batch_size must be a positive int"),
    (True, "batch_size must be a positive int"),
])
def test_batches_reject_bad_batch_size_at_the_call(batch_size: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        batches(np.zeros(4), np.zeros(4), batch_size)  # type: ignore[arg-type]


def test_batches_reject_mismatched_lengths_and_bad_rng() -> None:
    with pytest.raises(ValueError, match="x has 4 examples but y has 3"):
        batches(np.zeros(4), np.zeros(3), 2)
    with pytest.raises(TypeError, match="rng must be"):
        batches(np.zeros(4), np.zeros(4), 2, rng=np.random.RandomState(0))  # type: ignore[arg-type]
