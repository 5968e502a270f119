"""Winograd F(4x4, 3x3) behind the backend's conv2d and its two backward kernels: exact
against PyTorch in float64 and the im2col path, partial tiles, any padding, chunks and
`out=`; float32 within its stated error bound; and the shapes the rule sends to it.

The float32 bound: max |y - y64| <= 64 eps32 max (|w| * |x|), the correlation of the
absolute values being the scale of the terms the outputs sum (a dot product's classic
bound is K eps32 times it, elementwise; im2col's error measured within 2.5 eps32 times
it on these data). Winograd adds the rounding of the transforms, whose entries reach 5
(B) and 8 (A): on He-initialised weights and unit inputs with 16 to 256 channels it
measured at most 27 eps32 times the scale, forward and input gradient
(bench/winograd.py gives it relative to im2col's), so 64 leaves more than 2x headroom
while catching a wrong transform, which errs by the values themselves. The bound is
over the whole result, not per output: a Winograd output's error comes from its whole
6x6 tile, including inputs its own 3x3 window never reads (a corner output under
padding 2 sums one product but carries its tile's rounding).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pullback.backend import conv as backend_conv
from pullback.backend import winograd
from pullback.kernels import winograd as kernels

EPS32 = float(np.finfo(np.float32).eps)

CASES = [
    # (N, C, H, W), O, padding: odd sizes leave partial 4x4 tiles at the edges
    ((2, 3, 7, 9), 4, (0, 0)),
    ((1, 2, 6, 5), 3, (2, 2)),
    ((3, 4, 5, 11), 5, (1, 2)),
    ((2, 5, 10, 3), 2, (1, 0)),
    ((1, 2, 4, 5), 3, (3, 1)),  # the forward only: the input gradient would need 2 - 3
    # rows of at least ROWS_FROM_TILES tiles: the input transform reads rows, not a table
    ((2, 2, 9, 33), 3, (1, 1)),
    ((1, 3, 6, 36), 2, (2, 0)),
]
IDS = [f"x{c[0]}-o{c[1]}-p{c[2]}" for c in CASES]


@pytest.fixture
def forced(monkeypatch):
    """conv2d and conv2d_input_backward through Winograd (True) or im2col (False)."""
    def force(value: bool) -> None:
        monkeypatch.setattr(backend_conv, "WINOGRAD_FORCED", value)
    return force


def _torch(x, w, upstream, padding):
    tx = torch.from_numpy(x.astype(np.float64)).requires_grad_()
    tw = torch.from_numpy(w.astype(np.float64)).requires_grad_()
    y = F.conv2d(tx, tw, padding=padding)
    y.backward(torch.from_numpy(upstream.astype(np.float64)))
    return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy()


def _scales(x, w, upstream, padding):
    """The float32 bound's scales: the forward and both gradients of |x|, |w|, |upstream|."""
    return _torch(np.abs(x), np.abs(w), np.abs(upstream), padding)


def _both(cpu, x, w, upstream, padding):
    """The forward, the input gradient and the weight gradient."""
    y = cpu.conv2d(x, w, (1, 1), padding)
    return (y, cpu.conv2d_input_backward(upstream, w, x.shape, (1, 1), padding),
            cpu.conv2d_weight_backward(upstream, x, w.shape, (1, 1), padding))


def test_the_transform_kernels_are_lavins_matrices(rng):
    # One 6x6 tile of one channel, no padding: B^T d B, and A^T m A of 36 products.
    d = rng.standard_normal((1, 1, 6, 6))
    v = kernels.input_transform(d, np.empty(36), (0, 0), (1, 1), 1)
    np.testing.assert_allclose(v.reshape(6, 6), kernels.BT @ d[0, 0] @ kernels.BT.T,
                               rtol=1e-13, atol=1e-13)
    m = rng.standard_normal(36)
    out = kernels.output_transform(m, np.empty((1, 1, 4, 4)), (1, 1), 1)
    np.testing.assert_allclose(out[0, 0], kernels.AT @ m.reshape(6, 6) @ kernels.AT.T,
                               rtol=1e-13, atol=1e-13)
    # The upstream transform is the output transform's adjoint, A dY A^T; a 3x2 upstream
    # fills its one tile's first rows and columns, the rest reading as zeros.
    dy = rng.standard_normal((1, 1, 3, 2))
    u_up = kernels.upstream_transform(dy, np.empty(36), (1, 1), 1)
    padded = np.zeros((4, 4))
    padded[:3, :2] = dy[0, 0]
    np.testing.assert_allclose(u_up.reshape(6, 6), kernels.AT.T @ padded @ kernels.AT,
                               rtol=1e-13, atol=1e-13)
    # And G: the three give the 3x3 correlation of the tile.
    w = rng.standard_normal((1, 1, 3, 3))
    u = winograd.weight_transform(w).reshape(6, 6)
    y = kernels.AT @ (u * (kernels.BT @ d[0, 0] @ kernels.BT.T)) @ kernels.AT.T
    np.testing.assert_allclose(y, F.conv2d(torch.from_numpy(d), torch.from_numpy(w))[0, 0],
                               rtol=1e-12, atol=1e-12)


def test_the_cases_cover_both_ways_of_reading_the_input():
    widths = [winograd.tiles((h + 2 * p[0] - 2, w + 2 * p[1] - 2))[1]
              for (_, _, h, w), _, p in CASES]
    assert min(widths) < kernels.ROWS_FROM_TILES <= max(widths)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, padding", [
    ((2, 3, 7, 9), (0, 0)), ((1, 2, 6, 30), (2, 2)), ((3, 2, 5, 29), (1, 2)),
    ((2, 2, 9, 33), (1, 1)), ((1, 1, 4, 28), (1, 0)), ((2, 1, 3, 3), (1, 1))])
def test_both_input_transforms_give_each_tile_its_transform(rng, dtype, shape, padding):
    # input_rows_body (the wide maps') and input_table_body (any width's) on the same
    # chunk: each tile's B^T d B in its place, nothing written between the 36 matrices,
    # and the same sums in the same order, so the two agree bit for bit.
    m, c, h, w = shape
    grid = winograd.tiles((h + 2 * padding[0] - 2, w + 2 * padding[1] - 2))
    x = rng.standard_normal(shape).astype(dtype)
    padded = np.zeros((m, c, 4 * grid[0] + 2, 4 * grid[1] + 2))
    padded[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + w] = x
    tiles = np.lib.stride_tricks.sliding_window_view(padded, (6, 6), axis=(2, 3))[:, :, ::4, ::4]
    expected = np.einsum("ai,mcyxij,bj->abcmyx", kernels.BT, tiles, kernels.BT)
    count = m * c * grid[0] * grid[1]
    stride = count + 5
    got = []
    for body in (kernels.input_rows_body, kernels.input_table_body):
        v = np.full(36 * stride, np.nan, dtype)
        kernels.compiled(body, np.dtype(dtype))(x, v, *padding, *grid, stride, 0, c)
        matrices = v.reshape(36, stride)
        assert np.isnan(matrices[:, count:]).all()
        tolerance = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(matrices[:, :count].reshape(expected.shape), expected,
                                   rtol=tolerance, atol=tolerance * np.abs(expected).max())
        got.append(v)
    np.testing.assert_array_equal(*got)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_winograd_matches_torch_and_im2col(cpu, rng, forced, case):
    x_shape, o, padding = case
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal((o, x_shape[1], 3, 3))
    out_hw = tuple(s + 2 * p - 2 for s, p in zip(x_shape[2:], padding))
    upstream = rng.standard_normal((x_shape[0], o, *out_hw))
    forced(False)
    old = _both(cpu, x, w, upstream, padding)
    forced(True)
    new = _both(cpu, x, w, upstream, padding)
    wide = _torch(x, w, upstream, padding)
    for got, im2col, reference in zip(new, old, wide):
        np.testing.assert_allclose(got, reference, rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(got, im2col, rtol=1e-11, atol=1e-11)
    # float32: within the bound, against the same float64 reference
    x32, w32, up32 = (a.astype(np.float32) for a in (x, w, upstream))
    got32 = _both(cpu, x32, w32, up32, padding)
    for got, reference, scale in zip(got32, wide, _scales(x, w, upstream, padding)):
        assert got.dtype == np.float32
        assert np.abs(got - reference).max() <= 64 * EPS32 * scale.max()


def test_winograd_float32_error_bound_at_realistic_scale(cpu, rng, forced):
    # 64 channels, He-initialised weights, unit inputs, a partial tile: the bound holds
    # and the error is not a wrong transform's (that would be of the values' size).
    x = rng.standard_normal((2, 64, 9, 9)).astype(np.float32)
    w = (rng.standard_normal((64, 64, 3, 3)) * np.sqrt(2 / (9 * 64))).astype(np.float32)
    upstream = rng.standard_normal((2, 64, 9, 9)).astype(np.float32)
    forced(True)
    got = _both(cpu, x, w, upstream, (1, 1))
    wide = _torch(x, w, upstream, (1, 1))
    for result, reference, scale in zip(got, wide, _scales(x, w, upstream, (1, 1))):
        error = np.abs(result - reference)
        assert error.max() <= 64 * EPS32 * scale.max()
        assert error.max() > 0  # float32 arithmetic, not a float64 detour


def test_winograd_chunks_and_out(cpu, rng, forced, monkeypatch):
    # One sample per chunk (the scratch buffers reused), written into the given arrays.
    monkeypatch.setattr(winograd, "CHUNK_BYTES", 1)
    forced(True)
    x = rng.standard_normal((3, 4, 6, 7))
    w = rng.standard_normal((5, 4, 3, 3))
    upstream = rng.standard_normal((3, 5, 6, 7))
    out, grad = np.empty((3, 5, 6, 7)), np.empty(x.shape)
    assert cpu.conv2d(x, w, (1, 1), (1, 1), out=out) is out
    assert cpu.conv2d_input_backward(upstream, w, x.shape, (1, 1), (1, 1), out=grad) is grad
    y, gx, gw = _torch(x, w, upstream, (1, 1))
    np.testing.assert_allclose(out, y, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(grad, gx, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(cpu.conv2d_weight_backward(upstream, x, w.shape, (1, 1), (1, 1)),
                               gw, rtol=1e-11, atol=1e-11)


CHOICES = [
    # (N, C, O, side), stride, groups, forward chosen, input gradient chosen: the shapes
    # measured in bench/winograd.py
    ((128, 32, 64, 4), 1, 1, False, False),  # the digits CNN's second: 4x4 maps
    ((64, 3, 32, 32), 1, 1, False, False),  # an RGB input: too few channels
    ((64, 32, 64, 16), 1, 1, True, True),  # the 3x32x32 CNN's second
    ((64, 16, 16, 32), 1, 1, True, True),  # ResNet-20's stages: 16 channels,
    ((64, 32, 32, 16), 1, 1, True, True),  # 32 at 16x16,
    ((64, 64, 64, 8), 1, 1, True, True),  # 64 at 8x8
    ((64, 8, 16, 32), 1, 1, False, False),  # too few channels
    ((64, 32, 32, 6), 1, 1, False, False),  # maps under 8x8
    ((1, 64, 64, 56), 1, 1, True, True),  # ResNet-50 at batch 1
    ((1, 128, 128, 28), 1, 1, True, True),
    ((1, 256, 256, 14), 1, 1, False, False),
    ((1, 512, 512, 7), 1, 1, False, False),
    ((64, 32, 32, 16), 2, 1, False, False),  # stride 2
    ((64, 32, 32, 16), 1, 2, False, False),  # groups
]


@pytest.mark.parametrize("case", CHOICES, ids=[str(c) for c in CHOICES])
def test_the_rule_chooses_winograd_where_it_measured_faster(case):
    (n, c, o, side), stride, groups, forward, input_gradient = case
    x = np.broadcast_to(np.zeros((), np.float32), (n, c, side, side))
    w = np.broadcast_to(np.zeros((), np.float32), (o, c // groups, 3, 3))
    win = backend_conv.check_conv(x, w, (stride, stride), (1, 1), groups=groups)
    assert backend_conv._winograd(win, groups, n, c, o) is forward
    # The input gradient correlates the upstream's O channels into C.
    assert backend_conv._winograd(win, groups, n, o, c) is input_gradient


@pytest.mark.parametrize("batch, side, expected", [
    (2, 16, "both"),  # 32 tiles
    (1, 16, "neither"),  # 16 tiles
    (8, 8, "both"),  # 8x8 maps, 32 tiles
    (8, 6, "neither"),  # 6x6 maps
])
def test_conv2d_and_its_gradients_take_the_rules_choice(cpu, monkeypatch, batch, side,
                                                        expected):
    monkeypatch.setattr(backend_conv, "SPLIT_MACS", 1 << 62)  # whole: one call each
    calls = []
    monkeypatch.setattr(winograd, "correlate",
                        lambda x, u, padding, out, scratch, *epilogue: calls.append(x.shape) or out)
    monkeypatch.setattr(winograd, "weight_gradient",
                        lambda *args: calls.append("w") or np.zeros((32, 32, 3, 3)))
    x = np.zeros((batch, 32, side, side), np.float32)
    w = np.zeros((32, 32, 3, 3), np.float32)
    y = cpu.conv2d(x, w, (1, 1), (1, 1))
    cpu.conv2d_input_backward(y, w, x.shape, (1, 1), (1, 1))
    cpu.conv2d_weight_backward(y, x, w.shape, (1, 1), (1, 1))
    assert calls == {"both": [x.shape, y.shape, "w"], "neither": []}[expected]


def test_input_gradient_padding_past_two_stays_on_im2col(cpu, monkeypatch, forced):
    # Its correlation would need padding 2 - 3 < 0.
    forced(True)
    calls = []
    monkeypatch.setattr(winograd, "correlate",
                        lambda x, u, padding, out, scratch, *epilogue: calls.append(x.shape) or out)
    w = np.ones((2, 2, 3, 3))
    upstream = np.ones((1, 2, 8, 8))
    grad = cpu.conv2d_input_backward(upstream, w, (1, 2, 4, 4), (1, 1), (3, 3))
    assert calls == [] and grad.shape == (1, 2, 4, 4)


def test_kept_transforms_lift_the_count_of_tiles_but_not_the_rest():
    x = np.broadcast_to(np.zeros((), np.float32), (1, 32, 16, 16))  # 16 tiles
    w = np.broadcast_to(np.zeros((), np.float32), (32, 32, 3, 3))
    win = backend_conv.check_conv(x, w, (1, 1), (1, 1))
    assert not backend_conv._winograd(win, 1, 1, 32, 32)
    assert backend_conv._winograd(win, 1, 1, 32, 32, kept=True)
    small = backend_conv.check_conv(x[..., :6, :6], w, (1, 1), (1, 1))  # 6x6 maps
    assert not backend_conv._winograd(small, 1, 1, 32, 32, kept=True)
    assert not backend_conv._winograd(win, 1, 1, 8, 32, kept=True)  # 8 channels


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_constant_weights_transform_once_and_give_the_same_result(cpu, rng, monkeypatch,
                                                                  dtype):
    """conv2d(constant_weights=True) of one sample on 16x16 maps (16 tiles, im2col's
    otherwise) runs Winograd on the kernels' transform made at the first call and kept:
    bit for bit Winograd transforming them at every call, and torch's result; the entry
    goes with the weights."""
    import gc

    x = rng.standard_normal((1, 32, 16, 16)).astype(dtype)
    w = rng.standard_normal((32, 32, 3, 3)).astype(dtype)
    transforms = []
    plain = winograd.weight_transform
    monkeypatch.setattr(winograd, "weight_transform",
                        lambda kernels: transforms.append(kernels.shape) or plain(kernels))
    first = backend_conv.conv2d(x, w, (1, 1), (1, 1), constant_weights=True)
    second = backend_conv.conv2d(x, w, (1, 1), (1, 1), constant_weights=True)
    assert transforms == [w.shape]  # made once, then kept
    monkeypatch.setattr(backend_conv, "WINOGRAD_FORCED", True)
    each_time = backend_conv.conv2d(x, w, (1, 1), (1, 1))
    assert len(transforms) == 2
    np.testing.assert_array_equal(first, each_time)
    np.testing.assert_array_equal(second, each_time)
    expected = F.conv2d(torch.from_numpy(x.astype(np.float64)),
                        torch.from_numpy(w.astype(np.float64)), padding=1).numpy()
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(first, expected, rtol=tol, atol=tol)
    key = id(w)
    assert key in backend_conv._TRANSFORMS
    del w
    gc.collect()
    assert key not in backend_conv._TRANSFORMS


def test_weights_not_promised_constant_are_transformed_at_every_call(cpu, rng, monkeypatch):
    monkeypatch.setattr(backend_conv, "WINOGRAD_FORCED", True)
    x = rng.standard_normal((1, 16, 8, 8))
    w = rng.standard_normal((16, 16, 3, 3))
    before = backend_conv.conv2d(x, w, (1, 1), (1, 1))
    w[0] += 1.0  # changed in place between calls: nothing kept may hide it
    after = backend_conv.conv2d(x, w, (1, 1), (1, 1))
    expected = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(after, expected, rtol=1e-10, atol=1e-10)
    assert not np.allclose(before, after) and id(w) not in backend_conv._TRANSFORMS
