"""RecurrentOps: the defaults written in forward ops (and derived from the rules) agree
with CpuBackend's kernels, and bad operands are refused naming the op and shapes."""

from __future__ import annotations

import numpy as np
import pytest

import pullback  # noqa: F401 (the ops layer registers the rule-derived defaults)
from pullback.backend.recurrent import recurrent_ops
from pullback.errors import KernelError

SHAPES = {
    "lstm": ((3, 2, 8), (2, 2), (2, 2), (8, 2)),
    "gru": ((3, 2, 9), (2, 3), (9, 3), (9,)),
}


def _operands(kind: str, dtype: type, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(s).astype(dtype) for s in SHAPES[kind]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_defaults_in_forward_ops_match_the_cpu_kernels(kind, dtype, cpu, forward_only, rng):
    xs = _operands(kind, dtype, rng)
    default, fast = recurrent_ops(forward_only), recurrent_ops(cpu)
    forward, backward = f"{kind}_sequence", f"{kind}_sequence_backward"
    y = getattr(fast, forward)(*xs)
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-13}
    np.testing.assert_allclose(getattr(default, forward)(*xs), y, **tol)
    u = rng.standard_normal(y.shape).astype(dtype)
    for got, want in zip(getattr(default, backward)(u, *xs, y),
                         getattr(fast, backward)(u, *xs, y), strict=True):
        np.testing.assert_allclose(got, want, **tol)


def test_a_backward_computes_only_the_cotangents_needed(cpu, rng):
    xs = _operands("lstm", np.float64, rng)
    y = cpu.lstm_sequence(*xs)
    grads = cpu.lstm_sequence_backward(np.ones_like(y), *xs, y, (True, False, True, False))
    assert grads[1] is None and grads[3] is None
    assert grads[0].shape == xs[0].shape and grads[2].shape == xs[2].shape


@pytest.mark.parametrize("index, shape, message", [
    (0, (3, 2, 7), r"projected input must be \(T, N, 4 H\) = \(T, 2, 8\)"),
    (3, (8, 3), r"recurrent weight must be \(4 H, H\) = \(8, 2\)"),
    (2, (2, 3), r"initial cell state must have shape \(2, 2\)"),
])
def test_lstm_sequence_refuses_operands_that_do_not_fit(cpu, rng, index, shape, message):
    xs = _operands("lstm", np.float64, rng)
    xs[index] = np.zeros(shape)
    with pytest.raises(KernelError, match=r"^lstm_sequence: .*" + message) as err:
        cpu.lstm_sequence(*xs)
    assert shape in err.value.shapes


def test_gru_sequence_refuses_mixed_dtypes(cpu, rng):
    xs = _operands("gru", np.float64, rng)
    xs[3] = xs[3].astype(np.float32)
    with pytest.raises(KernelError, match=r"gru_sequence: .*one floating dtype"):
        cpu.gru_sequence(*xs)


@pytest.mark.parametrize("dtype", [np.float16, np.int64])
def test_lstm_sequence_refuses_a_shared_dtype_that_is_not_float32_or_float64(cpu, rng, dtype):
    # Every operand in the same dtype, but one the kernels have no loop for.
    xs = [x.astype(dtype) for x in _operands("lstm", np.float32, rng)]
    with pytest.raises(KernelError, match=r"lstm_sequence: .*one floating dtype"):
        cpu.lstm_sequence(*xs)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_small_sequence_in_one_kernel_matches_the_steps_through_blas(kind, cpu, rng,
                                                                      monkeypatch):
    # These shapes are small: one kernel runs every step. With the threshold at zero the
    # same operands go step by step, the products through BLAS.
    from pullback.backend import recurrent

    xs = _operands(kind, np.float64, rng)
    forward, backward = f"{kind}_sequence", f"{kind}_sequence_backward"
    y = getattr(cpu, forward)(*xs)
    u = rng.standard_normal(y.shape)
    grads = getattr(cpu, backward)(u, *xs, y)
    monkeypatch.setattr(recurrent, "SMALL_PRODUCT", 0)
    np.testing.assert_allclose(getattr(cpu, forward)(*xs), y, rtol=1e-12, atol=1e-13)
    for got, want in zip(getattr(cpu, backward)(u, *xs, y), grads, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_batch_split_over_the_cores_matches_it_run_whole(kind, dtype, cpu, rng,
                                                          monkeypatch):
    # Nine rows in parts of four and five, each part all steps of its rows: the same as
    # every row in one part.
    from pullback.backend import blas, recurrent, split

    gates = 4 if kind == "lstm" else 3
    steps, n, h = 4, 9, 3
    shapes = [(steps, n, gates * h), (n, h), (n, h), (gates * h, h)] if kind == "lstm" \
        else [(steps, n, gates * h), (n, h), (gates * h, h), (gates * h,)]
    xs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    forward, backward = f"{kind}_sequence", f"{kind}_sequence_backward"
    monkeypatch.setattr(recurrent, "SMALL_PRODUCT", 0)
    monkeypatch.setattr(blas, "_split", blas.splitting())  # what splitting notes, undone after
    monkeypatch.setattr(recurrent, "SPLIT_MACS", 0)
    monkeypatch.setattr(split, "parts", lambda rows: [(0, 4), (4, rows)])
    y = getattr(cpu, forward)(*xs)
    u = rng.standard_normal(y.shape).astype(dtype)
    grads = getattr(cpu, backward)(u, *xs, y)
    monkeypatch.setattr(split, "parts", lambda rows: [(0, rows)])
    # Each row's products and steps are the same computation either way: bit for bit.
    np.testing.assert_array_equal(getattr(cpu, forward)(*xs), y)
    for got, want in zip(getattr(cpu, backward)(u, *xs, y), grads, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("small", [True, False])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_backward_given_copied_states_computes_the_gates_again(kind, small, cpu, rng,
                                                                 monkeypatch):
    # The forward's result is a view of its whole state array, whose gates the backward
    # reads; states that are a copy hold no gates, and the backward runs the forward
    # again for them: the same bits.
    from pullback.backend import recurrent

    if not small:
        monkeypatch.setattr(recurrent, "SMALL_PRODUCT", 0)
    xs = _operands(kind, np.float32, rng)
    forward, backward = f"{kind}_sequence", f"{kind}_sequence_backward"
    y = getattr(cpu, forward)(*xs)
    assert y.shape == (2, 3, 2, 2) if kind == "lstm" else y.shape == (3, 2, 3)
    u = rng.standard_normal(y.shape).astype(np.float32)
    ran = []
    again = getattr(recurrent.CpuRecurrentOps, f"_{kind}_states")
    monkeypatch.setattr(recurrent.CpuRecurrentOps, f"_{kind}_states",
                        lambda self, *a: ran.append(1) or again(self, *a))
    grads = getattr(cpu, backward)(u, *xs, y)
    assert not ran
    copied = getattr(cpu, backward)(u, *xs, y.copy())
    assert ran
    for got, want in zip(copied, grads, strict=True):
        np.testing.assert_array_equal(got, want)
