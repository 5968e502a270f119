"""Fixtures for the kernel tests: a seeded generator, and the parallel path switched on.

Kernels run serially by default (their parallel loops fight OpenBLAS for the
cores in a training step); these tests lower every kernel's threshold to
TEST_PARALLEL_THRESHOLD so that large inputs exercise the parallel loops too.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from pullback.kernels import Kernel, activations, rows, updates

TEST_PARALLEL_THRESHOLD = 32768


def _all_kernels() -> list[Kernel]:
    found = []
    for module in (activations, rows, updates):
        for value in vars(module).values():
            if isinstance(value, Kernel):
                found.append(value)
                if value.backward is not None:
                    found.append(value.backward)
    return found


@pytest.fixture(autouse=True, scope="session")
def parallel_above_test_threshold() -> Iterator[None]:
    kernels = _all_kernels()
    saved = [k.parallel_threshold for k in kernels]
    for k in kernels:
        k.parallel_threshold = TEST_PARALLEL_THRESHOLD
    yield
    for k, threshold in zip(kernels, saved):
        k.parallel_threshold = threshold


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240607)
