"""The small-map convolution path (batch innermost, pullback.backend.conv) against the
general path it replaces and against PyTorch: forward, input gradient and weight
gradient, float32 and float64, with groups, row stride, padding, dilation and chunks
of several samples; and the tiled transpose kernel it moves the batch with."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pullback.backend import conv as backend_conv
from pullback.kernels import conv as kernels

CASES = [
    # (N, C, H, W), (O, kh, kw), stride, padding, dilation, groups
    ((9, 4, 6, 6), (8, 3, 3), (1, 1), (0, 0), (1, 1), 1),  # a digits CNN's second layer
    ((5, 8, 4, 4), (6, 3, 3), (1, 1), (1, 1), (1, 1), 2),  # pad 1 on a 4x4 map, groups
    ((4, 3, 7, 5), (5, 2, 3), (2, 1), (1, 2), (2, 1), 1),  # row stride, dilation
    ((3, 6, 5, 6), (6, 3, 2), (1, 1), (2, 1), (1, 2), 3),  # column dilation, padding
]
IDS = [f"x{c[0]}-w{c[1]}-s{c[2]}-p{c[3]}-d{c[4]}-g{c[5]}" for c in CASES]
TOL = {np.float32: 1e-5, np.float64: 1e-13}


def _three(x, w, upstream, geometry):
    """Forward, input gradient and weight gradient of the backend's conv2d."""
    return (backend_conv.conv2d(x, w, *geometry),
            backend_conv.conv2d_input_backward(upstream, w, x.shape, *geometry),
            backend_conv.conv2d_weight_backward(upstream, x, w.shape, *geometry))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_small_maps_match_the_general_path_and_torch(monkeypatch, case, dtype):
    monkeypatch.setattr(backend_conv, "DIRECT_FORCED", False)  # the paths compared here
    rng = np.random.default_rng(7)
    x_shape, (o, kh, kw), stride, padding, dilation, groups = case
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal((o, x_shape[1] // groups, kh, kw)).astype(dtype)
    geometry = (stride, padding, dilation, groups)
    win = backend_conv.check_conv(x, w, *geometry)
    upstream = rng.standard_normal((x_shape[0], o, *win.out_hw)).astype(dtype)
    # Chunks of two samples (and a last one of one): the path runs per chunk.
    per_sample = x_shape[1] * kh * kw * win.out_hw[0] * win.out_hw[1] * x.itemsize
    monkeypatch.setattr(backend_conv, "CHUNK_BYTES", 2 * per_sample)
    taken = []
    for name in ("_conv_batch_inner", "_input_backward_batch_inner",
                 "_weight_backward_batch_inner"):
        original = getattr(backend_conv, name)
        monkeypatch.setattr(backend_conv, name,
                            lambda *a, _f=original, _n=name: (taken.append(_n), _f(*a))[1])
    small = _three(x, w, upstream, geometry)
    assert len(taken) == 3  # all three took the small-map path
    monkeypatch.setattr(backend_conv, "SMALL_MAP_PIXELS", 0)
    general = _three(x, w, upstream, geometry)
    assert len(taken) == 3  # and none of them did here
    for got, want in zip(small, general):
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])
    tx = torch.from_numpy(x).requires_grad_()
    tw = torch.from_numpy(w).requires_grad_()
    ty = F.conv2d(tx, tw, stride=stride, padding=padding, dilation=dilation, groups=groups)
    ty.backward(torch.from_numpy(upstream))
    for got, want in zip(small, (ty.detach(), tx.grad, tw.grad)):
        np.testing.assert_allclose(got, want.numpy(), rtol=100 * TOL[dtype],
                                   atol=100 * TOL[dtype])


def test_a_first_layer_and_large_maps_keep_the_general_path():
    win = backend_conv.check_conv(np.empty((8, 1, 8, 8)), np.empty((32, 1, 3, 3)), (1, 1),
                                  (1, 1))
    assert not backend_conv._small_maps(win, [(0, 8)], 1, 32)  # 9 window values < 32
    assert backend_conv._small_maps(win, [(0, 8)], 4, 32)
    assert not backend_conv._small_maps(win, [(0, 1)], 4, 32)  # one sample per chunk
    big = backend_conv.check_conv(np.empty((8, 4, 16, 16)), np.empty((4, 4, 3, 3)), (1, 1),
                                  (1, 1))
    assert not backend_conv._small_maps(big, [(0, 8)], 4, 4)
    strided = backend_conv.check_conv(np.empty((8, 4, 8, 8)), np.empty((4, 4, 3, 3)), (1, 2),
                                      (1, 1))
    assert not backend_conv._small_maps(strided, [(0, 8)], 4, 4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transpose_kernel_matches_numpy(dtype):
    rng = np.random.default_rng(3)
    # Blocks of 8 (float32) or 4 (float64) in pairs and alone, along dst's rows or (its rows
    # a multiple of 512 bytes) down its columns; ragged edges.
    for shape in [(1, 1), (8, 8), (13, 37), (40, 9), (3, 130), (24, 40), (64, 48), (17, 33),
                  (128, 576), (512, 128), (256, 130), (130, 256), (96, 64)]:
        src = rng.standard_normal(shape).astype(dtype)
        dst = np.full(shape[::-1], np.nan, dtype)
        assert kernels.transpose(src, dst) is dst
        np.testing.assert_array_equal(dst, src.T)


@pytest.mark.parametrize("shape", [(3, 4, 4, 4), (2, 3, 7, 6)], ids=["tiled", "leftover"])
def test_max_pool_on_small_maps_matches_torch(shape):
    # Maps the 2x2 windows tile exactly run as one tall plane; 7x6 leaves a row over.
    rng = np.random.default_rng(5)
    x = rng.integers(0, 3, shape).astype(np.float32)  # ties: the first maximum wins
    y = backend_conv.max_pool2d(x, (2, 2), (2, 2), (0, 0))
    upstream = rng.standard_normal(y.shape).astype(np.float32)
    grad = backend_conv.max_pool2d_backward(upstream, x, y, (2, 2), (2, 2), (0, 0))
    tx = torch.from_numpy(x).requires_grad_()
    ty = F.max_pool2d(tx, 2)
    ty.backward(torch.from_numpy(upstream))
    np.testing.assert_array_equal(y, ty.detach().numpy())
    np.testing.assert_array_equal(grad, tx.grad.numpy())
