"""ThreadedCpuBackend against CpuBackend on inputs above the split threshold, and proof
that small inputs never reach the pool."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pullback.backend import KernelError, ThreadedCpuBackend

BIG = (64, 1024)  # 65536 elements: above the default threshold of 32768

UNARY = ["neg", "exp", "log", "sqrt", "abs", "sign", "relu", "sigmoid", "tanh", "silu",
         "softplus", "erf", "gelu", "sin", "cos"]
BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "less", "less_equal",
          "greater", "greater_equal", "equal", "not_equal"]
BACKWARD = ["relu_backward", "sigmoid_backward", "tanh_backward", "exp_backward",
            "log_backward", "sqrt_backward", "abs_backward", "silu_backward",
            "softplus_backward", "gelu_backward"]


def _positive(rng, shape, dtype=np.float32):
    return rng.uniform(0.1, 3.0, size=shape).astype(dtype)


def _same(threaded_out, cpu_out):
    assert threaded_out.dtype == cpu_out.dtype and threaded_out.shape == cpu_out.shape
    np.testing.assert_allclose(threaded_out, cpu_out, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", UNARY)
def test_split_unary_matches_cpu(cpu, threaded, rng, op, dtype):
    x = _positive(rng, BIG, dtype) * rng.choice([-1, 1], size=BIG) if op not in (
        "log", "sqrt") else _positive(rng, BIG, dtype)
    x = x.astype(dtype)
    _same(getattr(threaded, op)(x), getattr(cpu, op)(x))
    _same(getattr(threaded, op)(x.T), getattr(cpu, op)(x.T))  # strided input
    assert threaded._pool is not None  # the split path ran

def test_split_gelu_tanh_and_int_neg_match_cpu(cpu, threaded, rng):
    x = rng.standard_normal(BIG).astype(np.float32)
    _same(threaded.gelu(x, "tanh"), cpu.gelu(x, "tanh"))
    ints = rng.integers(-5, 5, size=BIG)
    _same(threaded.neg(ints), cpu.neg(ints))
    assert threaded._pool is not None  # the split path ran

@pytest.mark.parametrize(
    ("lhs", "rhs"),
    [(BIG, BIG), (BIG, BIG[-1:]), ((64, 1), BIG), (BIG, ()), ((4, 16, 1024), (16, 1))],
)
@pytest.mark.parametrize("op", BINARY)
def test_split_binary_matches_cpu(cpu, threaded, rng, op, lhs, rhs):
    a, b = _positive(rng, lhs), _positive(rng, rhs)
    _same(getattr(threaded, op)(a, b), getattr(cpu, op)(a, b))
    assert threaded._pool is not None  # the split path ran

@pytest.mark.parametrize("op", ["add", "mul", "div", "less"])
def test_split_binary_with_python_scalar_keeps_f32(cpu, threaded, rng, op):
    a = _positive(rng, BIG)
    for out, ref in ((getattr(threaded, op)(a, 1.5), getattr(cpu, op)(a, 1.5)),
                     (getattr(threaded, op)(2, a), getattr(cpu, op)(2, a))):
        _same(out, ref)
    assert threaded._pool is not None  # the split path ran

def test_split_where_and_clip_match_cpu(cpu, threaded, rng):
    a, b = rng.standard_normal(BIG).astype(np.float32), rng.standard_normal(BIG[-1:])
    cond = a > 0
    _same(threaded.where(cond, a, b.astype(np.float32)), cpu.where(cond, a, b.astype(np.float32)))
    _same(threaded.where(cond, a, 0.0), cpu.where(cond, a, 0.0))
    _same(threaded.where(a, a, 1), cpu.where(a, a, 1))  # a truthy float condition
    _same(threaded.clip(a, -0.5, 0.5), cpu.clip(a, -0.5, 0.5))
    _same(threaded.clip(a, None, 0.1), cpu.clip(a, None, 0.1))
    assert threaded._pool is not None  # the split path ran

@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axes", [(1,), (2,), (0,), (0, 2), (1, 2)])
def test_split_reduce_sum_matches_cpu(cpu, threaded, rng, axes, keepdims):
    x = rng.standard_normal((8, 64, 128))
    _same(threaded.reduce_sum(x, axes, keepdims), cpu.reduce_sum(x, axes, keepdims))
    flags = x > 0
    _same(threaded.reduce_sum(flags, axes, keepdims), cpu.reduce_sum(flags, axes, keepdims))
    assert threaded._pool is not None  # the split path ran

@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_split_softmax_matches_cpu(cpu, threaded, rng, op, axis):
    x = rng.standard_normal(BIG).astype(np.float32) * 10
    y = getattr(cpu, op)(x, axis)
    _same(getattr(threaded, op)(x, axis), y)
    u = rng.standard_normal(BIG).astype(np.float32)
    backward = f"{op}_backward"
    _same(getattr(threaded, backward)(u, y, axis), getattr(cpu, backward)(u, y, axis))
    assert threaded._pool is not None  # the split path ran

@pytest.mark.parametrize("kernel", BACKWARD)
def test_split_backward_kernels_match_cpu(cpu, threaded, rng, kernel):
    u = rng.standard_normal(BIG).astype(np.float32)
    saved = _positive(rng, BIG)
    _same(getattr(threaded, kernel)(u, saved), getattr(cpu, kernel)(u, saved))
    assert threaded._pool is not None  # the split path ran

def test_split_gelu_tanh_backward_matches_cpu(cpu, threaded, rng):
    u, x = rng.standard_normal(BIG), rng.standard_normal(BIG)
    _same(threaded.gelu_backward(u, x, "tanh"), cpu.gelu_backward(u, x, "tanh"))
    assert threaded._pool is not None  # the split path ran

def test_small_inputs_never_touch_the_pool(threaded, rng, monkeypatch):
    def refuse():
        raise AssertionError("the pool was used for a small op")

    monkeypatch.setattr(threaded, "_executor", refuse)
    x = rng.standard_normal((100, 100)).astype(np.float32)  # 10000 < 32768
    threaded.exp(x)
    threaded.add(x, x)
    threaded.where(x > 0, x, 0.0)
    threaded.clip(x, 0, 1)
    threaded.reduce_sum(x, (1,), False)
    threaded.softmax(x, -1)
    threaded.relu_backward(x, x)
    threaded.gelu_backward(x, x)
    assert threaded._pool is None


def test_large_inputs_use_the_pool(threaded, rng):
    assert threaded._pool is None
    threaded.exp(rng.standard_normal(BIG))
    assert threaded._pool is not None


def test_single_thread_runs_whole(rng, monkeypatch):
    backend = ThreadedCpuBackend(num_threads=1)
    monkeypatch.setattr(backend, "_executor", lambda: pytest.fail("pool used with one thread"))
    x = rng.standard_normal(BIG)
    np.testing.assert_array_equal(backend.exp(x), np.exp(x))


def test_threaded_defaults_to_cpu_count_and_names_itself():
    backend = ThreadedCpuBackend()
    assert backend.num_threads == (os.cpu_count() or 1)
    assert backend.name == "cpu-threaded" and ThreadedCpuBackend.parallel_threshold == 32768


def test_threaded_errors_match_cpu(threaded, rng):
    with pytest.raises(KernelError, match=r"add: \(64, 1024\) and \(3,\)"):
        threaded.add(rng.standard_normal(BIG), rng.standard_normal(3))
    with pytest.raises(KernelError, match=r"exp: .*expected a floating dtype"):
        threaded.exp(np.ones(BIG, dtype=np.int32))
    with pytest.raises(KernelError, match="neg: "):
        threaded.neg(np.ones(BIG, dtype=bool))


@pytest.mark.parametrize("op", ["relu", "sigmoid", "add", "mul", "relu_backward"])
def test_split_ops_keep_a_by_columns_layout_and_cpu_values(cpu, threaded, rng, op):
    # A GEMM's result laid out by columns (backend.gemm): each thread takes a contiguous
    # part of the transpose, and the result comes back laid out like the operands.
    x = np.asfortranarray(rng.standard_normal(BIG[::-1]).astype(np.float32))
    assert x.flags.f_contiguous and not x.flags.c_contiguous
    other = {"add": rng.standard_normal(BIG[0]).astype(np.float32),  # a bias per column
             "mul": np.asfortranarray(rng.standard_normal(BIG[::-1]).astype(np.float32)),
             "relu_backward": np.asfortranarray(rng.standard_normal(BIG[::-1])
                                                .astype(np.float32))}.get(op)
    args = (x,) if other is None else (other, x) if op == "relu_backward" else (x, other)
    got = getattr(threaded, op)(*args)
    assert got.flags.f_contiguous
    np.testing.assert_array_equal(got, getattr(cpu, op)(*args))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("axis", [0, 1])
def test_split_cumsum_matches_cpu(cpu, threaded, rng, axis, reverse, dtype):
    x = _positive(rng, BIG, dtype)
    _same(threaded.cumsum(x, axis, reverse), cpu.cumsum(x, axis, reverse))
    _same(threaded.cumsum(x.T, 1 - axis, reverse), cpu.cumsum(x.T, 1 - axis, reverse))
    assert threaded._pool is not None  # the split path ran
