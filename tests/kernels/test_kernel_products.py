"""kernels.products: stacks of matrix products on Numba's threads in register tiles,
against NumPy in float64, in float32 and float64, at the edges of their tiling: columns
past the last whole SIMD vector, several column blocks and k blocks, rows not a multiple
of a tile's, stacks cut by rows or one matrix a thread, strided stacks (Winograd's); the
same bits on one thread and two; the plain-Python bodies against the compiled ones; a
clear error for operands it cannot take; and a process forked after the threads started
runs its products on one."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pullback.errors import KernelError
from pullback.kernels import conv as conv_kernels
from pullback.kernels import direct, jit, products, tiles

# (n, M, K, P): ResNet-50's shapes at batch 1 and the tiling's edges.
SHAPES = [
    (1, 64, 64, 3136),  # a 1x1 convolution on 56x56: many column blocks
    (1, 2048, 512, 49),  # 7x7: 49 columns, a ragged last vector
    (36, 64, 64, 196),  # Winograd's 36 products: one matrix a thread
    (1, 13, 600, 403),  # rows not a tile's multiple, three k blocks, two column blocks
    (3, 5, 7, 3),  # fewer columns than a vector, a stack cut by rows
    (2, 1, 1, 1),
]
IDS = ["x".join(map(str, s)) for s in SHAPES]
TOL = {np.float32: 2e-6, np.float64: 1e-13}


def _operands(shape, dtype, seed=0):
    n, m, k, p = shape
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, m, k)).astype(dtype),
            rng.standard_normal((n, k, p)).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_products_match_numpy_and_are_the_same_on_any_thread_count(shape, dtype):
    a, b = _operands(shape, dtype)
    reference = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = max(1.0, np.abs(reference).max()) * np.sqrt(shape[2])
    results = []
    for threads in (1, 2, 3):
        c = np.full((shape[0], shape[1], shape[3]), np.nan, dtype)  # all must be written
        assert products.matmul(a, b, c, threads) is c
        np.testing.assert_allclose(c, reference, rtol=0, atol=TOL[dtype] * scale)
        results.append(c)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_strided_stacks_are_read_and_written_in_place(dtype):
    # Winograd's layout: 36 matrices an odd number of lines apart in flat arrays.
    rng = np.random.default_rng(1)
    c, t, o = 24, 49, 20
    v_flat = np.zeros(36 * (c * t + 11), dtype)
    v = np.ndarray((36, c, t), dtype, v_flat, strides=((c * t + 11) * v_flat.itemsize,
                                                      t * v_flat.itemsize, v_flat.itemsize))
    v[...] = rng.standard_normal(v.shape)
    u = rng.standard_normal((36, o, c)).astype(dtype)
    m_flat = np.full(36 * (o * t + 5), -7.0, dtype)
    m = np.ndarray((36, o, t), dtype, m_flat, strides=((o * t + 5) * m_flat.itemsize,
                                                      t * m_flat.itemsize, m_flat.itemsize))
    products.matmul(u, v, m, 2)
    np.testing.assert_allclose(m, np.matmul(u, v), rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)
    gaps = m_flat.reshape(36, o * t + 5)[:, o * t:]
    assert (gaps == -7.0).all()  # nothing written between the matrices


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 64, 64, 3136), (4, 13, 600, 403), (2, 5, 0, 7)],
                         ids=["blocks", "stack", "no-k"])
def test_the_epilogue_as_products_store_is_the_epilogue_pass_bit_for_bit(shape, dtype):
    from pullback.kernels import epilogue

    a, b = _operands(shape, dtype, seed=4)
    n, m, _, p = shape
    rng = np.random.default_rng(5)
    bias, scale, shift = (rng.standard_normal(n * m).astype(dtype) for _ in range(3))
    residual = rng.standard_normal((n, m, p)).astype(dtype)
    residual.flat[::11] = np.nan  # NaN stays NaN through relu
    for chosen in ((bias, scale, shift, residual, True), (None, scale, None, None, False),
                   (bias, None, None, residual, True)):
        fused = np.empty((n, m, p), dtype)
        products.matmul(a, b, fused, 2, products.Epilogue(*chosen))
        after = np.empty_like(fused)
        products.matmul(a, b, after, 2)
        flat = after.reshape(1, n * m, p)
        epilogue.apply(flat, *chosen[:3], None if chosen[3] is None else
                       chosen[3].reshape(1, n * m, p), chosen[4])
        np.testing.assert_array_equal(fused, after)
    with pytest.raises(KernelError, match=rf"per-channel values must be \({n * m},\)"):
        products.matmul(a, b, fused, 2, products.Epilogue(bias[:1], None, None, None, False))
    with pytest.raises(KernelError, match="residual must be"):
        narrow = products.Epilogue(None, None, None, residual[..., 1:], False)
        products.matmul(a, b, fused, 2, narrow)


def test_an_empty_inner_dimension_gives_zeros_and_an_empty_result_nothing():
    c = np.full((2, 3, 4), np.nan, np.float32)
    products.matmul(np.ones((2, 3, 0), np.float32), np.ones((2, 0, 4), np.float32), c, 2)
    assert (c == 0).all()
    empty = np.empty((1, 0, 4), np.float32)
    assert products.matmul(np.ones((1, 0, 3), np.float32), np.ones((1, 3, 4), np.float32),
                           empty, 2) is empty


def test_operands_it_cannot_take_are_refused_by_name():
    a, b = np.ones((1, 4, 5), np.float32), np.ones((1, 5, 6), np.float32)
    with pytest.raises(KernelError, match=r"matmul.*\(1, 4, 5\).*\(1, 6, 5\)"):
        products.matmul(a, np.ones((1, 6, 5), np.float32), np.empty((1, 4, 5), np.float32), 2)
    with pytest.raises(KernelError, match="unit-strided"):
        products.matmul(a, np.ones((1, 5, 12), np.float32)[:, :, ::2],
                        np.empty((1, 4, 6), np.float32), 2)
    with pytest.raises(KernelError, match="overlap"):
        whole = np.ones((1, 5, 6), np.float32)
        products.matmul(np.ones((1, 5, 5), np.float32), whole, whole, 2)
    with pytest.raises(KernelError, match=r"float64 and float32|float32 and float64"):
        products.matmul(a.astype(np.float64), b, np.empty((1, 4, 6), np.float32), 2)
    with pytest.raises(KernelError, match="int32"):
        products.matmul(a.astype(np.int32), b.astype(np.int32), np.empty((1, 4, 6), np.int32), 2)


@pytest.mark.parametrize("shape", [(1, 13, 600, 403), (3, 5, 7, 3)], ids=["blocks", "tiny"])
def test_the_plain_python_bodies_give_the_compiled_results(shape):
    # stack_body and part_body run as Python, their tiles direct's plain oracles.
    a, b = _operands(shape, np.float64, seed=2)
    n, m, k, p = shape
    lanes = 4  # float64 in 256-bit vectors: the oracle takes any width
    scope = dict(products.stack_body.__globals__, LANES=lanes, prange=range)
    oracle = jit.rebound(direct.tile, dict(direct.tile.__globals__, LANES=lanes))
    oracle_add = jit.rebound(direct.tile_add, dict(direct.tile_add.__globals__, LANES=lanes))
    oracle.__globals__["tile_add"] = oracle_add
    scope.update(tile=oracle, tile_add=oracle_add)
    scope["part_body"] = jit.rebound(products.part_body, scope)
    scope["finish"] = products.finish
    rng = np.random.default_rng(3)
    bias, shift = rng.standard_normal(n * m), rng.standard_normal(n * m)
    residual = rng.standard_normal((n, m, p))
    c = np.full((n, m, p), np.nan)
    per_channel = np.stack([bias, np.zeros(n * m), shift])
    flags = np.array([1, 0, 1, 1, 1, 1], np.uint8)
    jit.rebound(products.stack_body, scope)(a, b, c, np.empty((n, p % lanes, k)), 2, m < p,
                                            per_channel, residual, flags, 0.0)
    compiled = np.empty_like(c)
    products.matmul(a, b, compiled, 2, products.Epilogue(bias, None, shift, residual, True))
    np.testing.assert_allclose(c, compiled, rtol=1e-13, atol=1e-13)
    assert (c == 0).any() and (c > 0).any()  # relu had work to do


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX's")
def test_a_child_forked_after_the_threads_started_runs_on_one():
    a, b = _operands((1, 16, 32, 40), np.float32)
    c = np.empty((1, 16, 40), np.float32)
    products.matmul(a, b, c, 2)  # the parent's threads have started
    pid = os.fork()
    if pid == 0:
        try:
            mine = np.empty_like(c)
            ok = products.threads() == 1 and products.matmul(a, b, mine, 2) is mine \
                and np.array_equal(mine, c)
        except BaseException:  # any failure is the exit status
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert products.threads() == jit.numba().get_num_threads()  # the parent's unchanged


def test_the_kernel_is_named_after_the_tiles_and_the_epilogue_it_compiles_in():
    # Both files' code compiles into it: an edit to either must not load stale code.
    from pullback.kernels import epilogue, tiles

    def body():
        return None

    both = jit.depending_on(jit.rebound(body, {}), tiles, epilogue).__qualname__
    tiles_only = jit.depending_on(jit.rebound(body, {}), tiles).__qualname__
    name = products.compiled(np.dtype(np.float32)).py_func.__qualname__
    assert name.startswith("stack_body_parallel_A_")
    assert name.endswith(both.rsplit("_", 1)[1]) and not name.endswith(tiles_only.rsplit("_", 1)[1])


# ---------------------------------------------------------------- windows_matmul
# (C, H, W), (M, kh, kw), stride, padding, dilation, a part's scratch in bytes: blocks
# of output rows whose columns end mid-vector, a last block shorter than the others.
WINDOW_CASES = [
    ((3, 30, 30), (16, 7, 7), 2, 3, 1, 6000),  # a stem: 12 x 12 outputs, blocks of 2 rows
    ((5, 9, 11), (7, 3, 3), 1, 1, 1, 700),  # 9 x 11 outputs, one row a block
    ((4, 13, 12), (9, 3, 2), 2, (2, 1), 2, 2000),  # dilated, uneven padding
    ((2, 6, 6), (3, 3, 3), 1, 0, 1, 1 << 20),  # one block
]
WINDOW_IDS = ["c{}x{}x{}-w{}x{}x{}".format(*case[0], *case[1]) for case in WINDOW_CASES]


def _windows_case(case, dtype, seed=0):
    (c, h, w), (m, kh, kw), stride, padding, dilation, _ = case
    padding = padding if isinstance(padding, tuple) else (padding, padding)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, c, h, w)).astype(dtype)
    weights = rng.standard_normal((m, c * kh * kw)).astype(dtype)
    out_hw = tuple((size + 2 * p - dilation * (k - 1) - 1) // stride + 1
                   for size, p, k in zip((h, w), padding, (kh, kw)))
    windows = np.empty((1, c, kh, kw, *out_hw), dtype)
    geometry = conv_kernels.geometry((kh, kw), (stride, stride), padding,
                                     (dilation, dilation), out_hw, windows)
    conv_kernels.unfold(x, windows, geometry, 0.0)  # im2col, the way it replaces
    return x, weights, geometry, windows.reshape(c * kh * kw, -1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", WINDOW_CASES, ids=WINDOW_IDS)
def test_windows_products_are_im2col_then_the_product_on_any_thread_count(
        monkeypatch, case, dtype):
    monkeypatch.setattr(products, "WINDOW_BYTES", case[-1])
    x, weights, geometry, windows = _windows_case(case, dtype)
    reference = weights.astype(np.float64) @ windows.astype(np.float64)
    scale = max(1.0, np.abs(reference).max()) * np.sqrt(weights.shape[1])
    results = []
    for threads in (1, 2, 3):
        c = np.full(reference.shape, np.nan, dtype)  # all must be written
        assert products.windows_matmul(x, weights, c, geometry, threads) is c
        np.testing.assert_allclose(c, reference, rtol=0, atol=TOL[dtype] * scale)
        results.append(c)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_windows_products_apply_the_epilogue_as_they_store(monkeypatch, dtype):
    monkeypatch.setattr(products, "WINDOW_BYTES", 6000)
    x, weights, geometry, windows = _windows_case(WINDOW_CASES[0], dtype, seed=4)
    m, p = weights.shape[0], windows.shape[1]
    rng = np.random.default_rng(5)
    bias, scale, shift = (rng.standard_normal(m).astype(dtype) for _ in range(3))
    residual = rng.standard_normal((1, m, p)).astype(dtype)
    c = np.full((m, p), np.nan, dtype)
    products.windows_matmul(x, weights, c, geometry, 2,
                            products.Epilogue(bias, scale, shift, residual, True))
    product = weights.astype(np.float64) @ windows.astype(np.float64)
    want = np.maximum((product + bias[:, None]) * scale[:, None] + shift[:, None]
                      + residual[0], 0)
    np.testing.assert_allclose(c, want, rtol=TOL[dtype] * 100, atol=TOL[dtype] * 100)
    assert (c == 0).any() and (c > 0).any()  # relu had work to do


def test_windows_products_refuse_what_they_cannot_take():
    x, weights, geometry, windows = _windows_case(WINDOW_CASES[1], np.float32)
    c = np.empty((weights.shape[0], windows.shape[1]), np.float32)
    with pytest.raises(KernelError, match=r"windows_matmul: .*w \(M, C kh kw\)"):
        products.windows_matmul(x, weights[:, 1:], c, geometry, 2)
    with pytest.raises(KernelError, match=r"windows_matmul: .*C-contiguous"):
        products.windows_matmul(x, weights, np.empty(c.shape[::-1], np.float32).T, geometry,
                                2)
    with pytest.raises(KernelError, match=r"windows_matmul: .*mixed dtypes"):
        products.windows_matmul(x.astype(np.float64), weights, c, geometry, 2)


def test_windows_products_pay_for_first_layers_only():
    f32 = np.dtype(np.float32)
    assert products.windows_pay(64, 147, 112 * 112, f32)  # ResNet-50's stem
    assert not products.windows_pay(64, 147, 12 * 12, f32)  # its windows fit a scratch
    assert not products.windows_pay(512, 256, 28 * 28, f32)  # weights of 512 KiB
    assert not products.windows_pay(128, 1152, 28 * 28, f32)  # blocks too narrow


def test_the_plain_python_windows_body_gives_the_compiled_result(monkeypatch):
    monkeypatch.setattr(products, "WINDOW_BYTES", 700)
    x, weights, geometry, windows = _windows_case(WINDOW_CASES[1], np.float64, seed=6)
    m, k, p = weights.shape[0], weights.shape[1], windows.shape[1]
    compiled = np.empty((m, p))
    products.windows_matmul(x, weights, compiled, geometry, 2)
    lanes = 4  # float64 in 256-bit vectors: the oracle takes any width
    scope = dict(products.windows_body.__globals__, LANES=lanes, prange=range)
    oracle = jit.rebound(direct.tile, dict(direct.tile.__globals__, LANES=lanes))
    oracle_add = jit.rebound(direct.tile_add, dict(direct.tile_add.__globals__, LANES=lanes))
    oracle.__globals__["tile_add"] = oracle_add
    scope.update(tile=oracle, tile_add=oracle_add, finish=products.finish)
    scope["part_body"] = jit.rebound(products.part_body, scope)
    rows, height = 1, int(geometry[8])  # 700 bytes: one output row a block
    geometries = np.repeat(geometry[None], height, axis=0)
    geometries[:, 4] -= np.arange(height) * geometry[2]
    geometries[:, 8] = 1
    c = np.full((m, p), np.nan)
    jit.rebound(products.windows_body, scope)(
        x, weights, c, geometries, rows, np.empty((2, k * geometry[9])),
        np.empty((2, lanes, k)), 2, np.empty((3, 0)), np.empty((0, 0)),
        np.zeros(6, np.uint8), 0.0)
    np.testing.assert_allclose(c, compiled, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_products_in_256_bit_vectors_where_the_cpu_has_no_avx512(monkeypatch, dtype):
    monkeypatch.setattr(tiles, "widest_bytes", lambda: tiles.VECTOR_BYTES)
    assert products._lanes(np.dtype(dtype)) == tiles.VECTOR_BYTES // np.dtype(dtype).itemsize
    for shape in [(1, 2048, 512, 49), (1, 13, 600, 403), (36, 64, 64, 196)]:
        a, b = _operands(shape, dtype)
        reference = np.matmul(a.astype(np.float64), b.astype(np.float64))
        scale = max(1.0, np.abs(reference).max()) * np.sqrt(shape[2])
        c = products.matmul(a, b, np.full(reference.shape, np.nan, dtype), 2)
        np.testing.assert_allclose(c, reference, rtol=0, atol=TOL[dtype] * scale)


def test_the_widest_vectors_follow_numbas_target(monkeypatch):
    config = jit.numba().config
    monkeypatch.setattr(config, "CPU_NAME", "generic")
    monkeypatch.setattr(config, "CPU_FEATURES", "")
    assert tiles.widest_bytes.__wrapped__() == tiles.VECTOR_BYTES
    monkeypatch.setattr(config, "CPU_NAME", "skylake-avx512")
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx2,+avx512f,+fma")
    assert tiles.widest_bytes.__wrapped__() == tiles.WIDE_BYTES
