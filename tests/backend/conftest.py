"""Fixtures for the backend tests: the backends under test, a forward-only backend that
gets every backward kernel from the `BackwardOps` defaults, and a seeded generator."""

from __future__ import annotations

import numpy as np
import pytest

from pullback.backend import Backend, BackwardOps, CpuBackend, ThreadedCpuBackend

# CpuBackend's forward ops, without its fused backward overrides.
_FORWARD_OPS = {
    name: vars(CpuBackend)[name]
    for name, value in vars(Backend).items()
    if callable(value) and not name.startswith("_")
}
ForwardOnly = type("ForwardOnly", (BackwardOps, Backend), {**_FORWARD_OPS, "name": "forward-only"})


@pytest.fixture(scope="session")
def cpu() -> CpuBackend:
    return CpuBackend()


@pytest.fixture(scope="session")
def forward_only() -> Backend:
    return ForwardOnly()


@pytest.fixture
def threaded():
    backend = ThreadedCpuBackend(num_threads=2)
    yield backend
    backend.close()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)
