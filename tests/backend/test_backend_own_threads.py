"""A convolution over a batch of one on pullback's own threads (kernels.products, the
transforms', im2col's and the epilogue's parallel loops): against PyTorch in float32 and
float64 on every path it takes (pointwise, im2col at strides 1 and 2, dilated, grouped,
Winograd with the weights' transform kept or not); the parallel passes bit for bit their
serial selves; and the rule: a batch of one outside a split, BLAS's threads otherwise."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pullback.backend import CpuBackend, blas, winograd
from pullback.backend import conv as backend_conv
from pullback.kernels import conv as conv_kernels
from pullback.kernels import epilogue, products
from pullback.kernels import winograd as winograd_kernels

# (C, H, W), (O, kh, kw), stride, padding, dilation, groups, Winograd's weights kept
CASES = [
    ((64, 14, 14), (48, 1, 1), 1, 0, 1, 1, False),  # pointwise: one product
    ((3, 30, 30), (16, 7, 7), 2, 3, 1, 1, False),  # a stem: im2col at stride 2
    ((24, 9, 9), (20, 3, 3), 2, 1, 1, 1, False),
    ((16, 11, 11), (12, 3, 3), 1, 2, 2, 1, False),  # dilated
    ((16, 10, 10), (24, 3, 3), 1, 1, 1, 4, False),  # four groups: a stack of products
    ((32, 24, 24), (16, 3, 3), 1, 1, 1, 1, False),  # Winograd: 36 tiles
    ((16, 13, 13), (16, 3, 3), 1, 1, 1, 1, True),  # Winograd, transform kept (a plan's)
    ((512, 7, 7), (40, 3, 3), 1, 1, 1, 1, True),  # 7x7 maps: im2col, a long k
]
IDS = ["c{}x{}x{}-w{}x{}x{}-s{}p{}d{}g{}{}".format(*c[0], *c[1], *c[2:6], "-kept" * c[6])
       for c in CASES]
TOL = {np.float32: 1e-4, np.float64: 1e-11}


@pytest.fixture
def counted(monkeypatch):
    """The product stacks run on pullback's threads, as (n, M, K, P, an epilogue?)."""
    seen = []
    run = products.matmul

    def matmul(a, b, c, threads, epilogue=None):
        seen.append((a.shape[0], a.shape[1], a.shape[2], b.shape[2], epilogue is not None))
        return run(a, b, c, threads, epilogue)

    monkeypatch.setattr(products, "matmul", matmul)
    return seen


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_batch_of_one_on_pullbacks_threads_matches_torch(monkeypatch, counted, case, dtype):
    monkeypatch.setattr(backend_conv, "OWN_THREADS_FORCED", True)
    (c, h, w), (o, kh, kw), stride, padding, dilation, groups, kept = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, c, h, w)).astype(dtype)
    weight = (rng.standard_normal((o, c // groups, kh, kw)) / np.sqrt(c * kh * kw)).astype(dtype)
    bias = rng.standard_normal(o).astype(dtype)
    expected = F.conv2d(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias),
                        stride, padding, dilation, groups).numpy()
    residual = rng.standard_normal(expected.shape).astype(dtype)
    out = np.full(expected.shape, np.nan, dtype)  # every value must be written
    pair = (stride, stride), (padding, padding), (dilation, dilation)
    got = CpuBackend().conv2d_epilogue(x, weight, bias, None, None, residual, True, *pair,
                                       groups, out=out, constant_weights=kept)
    assert got is out and counted  # its products ran on pullback's threads
    want = np.maximum(expected + residual, 0)
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])
    if kh == 3 and stride == 1 and dilation == 1 and h >= 13:
        assert counted[0][0] == winograd_kernels.POSITIONS  # Winograd's 36 products
        assert not counted[0][-1]  # its epilogue after the output transform
    else:
        assert counted[0][0] == groups and counted[0][-1]  # applied as the products store
    # BLAS's threads instead: the same convolution within rounding
    monkeypatch.setattr(backend_conv, "OWN_THREADS_FORCED", False)
    before = len(counted)
    blas_way = CpuBackend().conv2d_epilogue(x, weight, bias, None, None, residual, True, *pair,
                                            groups, constant_weights=kept)
    assert len(counted) == before
    np.testing.assert_allclose(got, blas_way, rtol=TOL[dtype], atol=TOL[dtype])


# (C, H, W), (O, kh, kw), stride, padding, dilation: im2col's paths, fused
FUSED = [((3, 30, 30), (16, 7, 7), 2, 3, 1), ((5, 9, 9), (20, 3, 3), 2, 1, 1),
         ((4, 11, 11), (12, 3, 3), 1, 2, 2)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", FUSED, ids=["stem", "strided", "dilated"])
def test_first_layers_multiply_their_windows_as_they_make_them(monkeypatch, case, dtype):
    # windows_matmul in place of im2col then the product, its blocks a few rows each
    monkeypatch.setattr(backend_conv, "OWN_THREADS_FORCED", True)
    monkeypatch.setattr(products, "windows_pay", lambda *_: True)
    monkeypatch.setattr(products, "WINDOW_BYTES", 4000)
    fused = []
    run = products.windows_matmul
    monkeypatch.setattr(products, "windows_matmul",
                        lambda *args: fused.append(args[-1]) or run(*args))
    (c, h, w), (o, kh, kw), stride, padding, dilation = case
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, c, h, w)).astype(dtype)
    weight = (rng.standard_normal((o, c, kh, kw)) / np.sqrt(c * kh * kw)).astype(dtype)
    bias = rng.standard_normal(o).astype(dtype)
    expected = F.conv2d(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias),
                        stride, padding, dilation).numpy()
    residual = rng.standard_normal(expected.shape).astype(dtype)
    pair = (stride, stride), (padding, padding), (dilation, dilation)
    got = CpuBackend().conv2d_epilogue(x, weight, bias, None, None, residual, True, *pair, 1,
                                       out=np.full(expected.shape, np.nan, dtype))
    np.testing.assert_allclose(got, np.maximum(expected + residual, 0), rtol=TOL[dtype],
                               atol=TOL[dtype])
    plain = backend_conv.conv2d(x, weight, *pair)  # no epilogue
    np.testing.assert_allclose(plain, expected - bias[:, None, None], rtol=TOL[dtype],
                               atol=TOL[dtype])
    assert len(fused) == 2 and fused[0] is not None and fused[1] is None


def test_the_rule_a_batch_of_one_outside_a_split(monkeypatch, counted):
    monkeypatch.setattr(products, "threads", lambda: 2)
    monkeypatch.setattr(blas, "threads", lambda: 2)
    assert backend_conv._own_threads(1, np.dtype(np.float32)) == 2
    assert backend_conv._own_threads(2, np.dtype(np.float32)) == 0
    assert backend_conv._own_threads(1, np.dtype(np.float16)) == 0
    monkeypatch.setattr(blas, "threads", lambda: 1)  # BLAS pinned to one: so are we
    assert backend_conv._own_threads(1, np.dtype(np.float64)) == 0
    monkeypatch.setattr(blas, "threads", lambda: 2)
    monkeypatch.setattr(backend_conv._PART, "batch", 4, raising=False)  # a split's part
    assert backend_conv._own_threads(1, np.dtype(np.float32)) == 0
    monkeypatch.setattr(backend_conv._PART, "batch", None)
    monkeypatch.setattr(backend_conv, "OWN_THREADS_FORCED", False)
    assert backend_conv._own_threads(1, np.dtype(np.float32)) == 0
    x = np.ones((2, 4, 6, 6), np.float32)
    backend_conv.conv2d(x, np.ones((3, 4, 1, 1), np.float32), (1, 1), (0, 0))
    assert not counted  # a batch of two: BLAS's way


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_parallel_passes_are_their_serial_selves_bit_for_bit(dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 13, 17, 15)).astype(dtype)
    # the epilogue
    rows = rng.standard_normal((1, 13, 40)).astype(dtype)
    vectors = [rng.standard_normal(13).astype(dtype) for _ in range(3)]
    residual = rng.standard_normal(rows.shape).astype(dtype)
    one, two = rows.copy(), rows.copy()
    epilogue.apply(one, *vectors, residual, True, 1)
    epilogue.apply(two, *vectors, residual, True, 3)
    np.testing.assert_array_equal(one, two)
    # im2col, its window rows (channel, offset) cut over the threads
    win = backend_conv.check_conv(x, np.ones((5, 13, 3, 3), dtype), (2, 1), (1, 2), (1, 1), 1)
    cols = [np.full((1, 13, 3, 3, *win.out_hw), np.nan, dtype) for _ in range(2)]
    for threads, buffer in zip((0, 3), cols):
        conv_kernels.unfold(x, buffer, win.geometry(buffer), 0.0, threads)
    np.testing.assert_array_equal(*cols)
    # max pooling whose windows are not tiles (ResNet's 3x3, stride 2), NaN winning
    x[0, 2, 3, 4] = np.nan
    pooled = [np.full((1, 13, 9, 8), np.nan, dtype) for _ in range(2)]
    geometry = backend_conv.check_pool("max_pool2d", x, (3, 3), (2, 2), (1, 1)).geometry()
    for threads, into in zip((0, 3), pooled):
        conv_kernels.max_pool(x, into, geometry, threads)
    np.testing.assert_array_equal(*pooled)
    assert np.isnan(pooled[0][0, 2]).sum() == 2  # the two windows that hold it
    # Winograd's transforms, wide maps (input_rows_body) and narrow (input_table_body)
    for shape in ((1, 13, 30, 30), (1, 13, 9, 9)):
        x = rng.standard_normal(shape).astype(dtype)
        grid = winograd.tiles(shape[2:])
        stride = 13 * grid[0] * grid[1] + 3
        v = [np.full(36 * stride, np.nan, dtype) for _ in range(2)]
        for threads, flat in zip((0, 3), v):
            winograd_kernels.input_transform(x, flat, (1, 1), grid, stride, threads)
        np.testing.assert_array_equal(*v)
        out = [np.full(shape, np.nan, dtype) for _ in range(2)]
        for threads, into in zip((0, 3), out):
            winograd_kernels.output_transform(np.nan_to_num(v[0]), into, grid, stride, threads)
        np.testing.assert_array_equal(*out)


def test_two_python_threads_share_the_crew_one_convolution_at_a_time(monkeypatch):
    import threading

    monkeypatch.setattr(backend_conv, "OWN_THREADS_FORCED", True)
    rng = np.random.default_rng(6)
    cases = [(rng.standard_normal((1, 16, 24, 24)).astype(np.float32),
              rng.standard_normal((16, 16, k, k)).astype(np.float32), (s, s), (k // 2, k // 2))
             for k, s in ((1, 1), (3, 1), (3, 2))]
    backend = CpuBackend()
    expected = [backend.conv2d(*case) for case in cases]
    pooled = backend_conv.max_pool2d(expected[1], (3, 3), (2, 2), (1, 1))
    wrong = []

    def run():
        for _ in range(20):
            for case, want in zip(cases, expected):
                if not np.array_equal(backend.conv2d(*case), want):
                    wrong.append(case[1].shape)
            if not np.array_equal(backend_conv.max_pool2d(expected[1], (3, 3), (2, 2),
                                                          (1, 1)), pooled):
                wrong.append("max_pool2d")

    workers = [threading.Thread(target=run) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not wrong
