"""Kernel compilation from several threads at once: kernels whose bodies compile to the
same code (as generated fused chains do) share one compiled module, and neither thread
may find it closed to compiling by the other."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import numpy as np
import pytest

from pullback.kernels import Kernel, jit, kernel


def _twin_kernels(constant: float) -> list[Kernel]:
    """Two kernel objects whose bodies differ only in their argument's name: the same
    bytecode, so the same generated module."""
    twins = []
    for name in ("a", "b"):
        scope = {"__name__": __name__}
        exec(f"def twin({name}):\n    return {name} * {constant!r} + 1.0\n", scope)
        twins.append(kernel(scope["twin"]))
    return twins


def test_two_threads_compiling_kernels_that_share_a_module(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fresh cache folder and constant: both threads really compile, nothing is loaded.
    monkeypatch.setattr(jit, "_cache_dir", tmp_path)
    constant = random.Random().random()
    twins = _twin_kernels(constant)
    x = np.arange(6.0)
    start = threading.Barrier(len(twins))
    results: list[object] = [None] * len(twins)

    def call(i: int) -> None:
        start.wait(timeout=60)
        try:
            results[i] = twins[i](x)
        except Exception as err:  # reported below, in the test's thread
            results[i] = err

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(twins))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for result in results:
        assert isinstance(result, np.ndarray), result
        np.testing.assert_array_equal(result, x * constant + 1.0)


def _double(x, out):
    for i in range(x.shape[0]):
        out[i] = 2.0 * x[i]


def test_compiled_once_makes_one_dispatcher_for_many_threads_and_compiles_nothing_more(
) -> None:
    # Eight threads ask for the same key at once: `make` runs once, all get one
    # dispatcher, which runs its signature and refuses another rather than compiling.
    made: list[int] = []
    key = (_double, "test_compiled_once", random.Random().random())

    def make() -> tuple:
        made.append(1)
        array = jit.array_type(np.dtype(np.float64), 1, "C")
        return _double, (array, array)

    start = threading.Barrier(8)
    found: list[object] = [None] * 8

    def ask(i: int) -> None:
        start.wait(timeout=60)
        found[i] = jit.compiled_once(key, make)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(made) == 1
    assert all(f is found[0] for f in found)
    out = np.empty(3)
    found[0](np.arange(3.0), out)  # type: ignore[operator]
    np.testing.assert_array_equal(out, [0.0, 2.0, 4.0])
    with pytest.raises(TypeError):
        found[0](np.arange(3, dtype=np.float32), np.empty(3, np.float32))  # type: ignore[operator]
