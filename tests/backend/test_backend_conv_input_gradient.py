"""The input gradient of a stride-1 convolution taken as conv2d of the upstream by the
rotated weights (pullback.backend.conv `_input_gradient_as_forward`): against the GEMM
+ col2im way it replaces and against PyTorch, float32 and float64, with padding,
dilation and groups; and the shapes the rule keeps on the old way."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pullback.backend import conv as backend_conv

CASES = [
    # (N, C, H, W), (O, kh, kw), padding, dilation, groups
    ((3, 16, 12, 11), (16, 3, 3), (1, 1), (1, 1), 1),  # "same", C = O (ResNet's 16@32x32)
    ((2, 8, 9, 9), (4, 3, 3), (0, 0), (1, 1), 1),  # no padding: the correlation pads 2
    ((2, 6, 8, 7), (6, 3, 2), (2, 1), (1, 1), 3),  # padding = span - 1, groups
    ((2, 4, 10, 9), (4, 3, 3), (1, 2), (2, 1), 2),  # dilation
    ((5, 6, 5, 5), (6, 3, 3), (1, 1), (1, 1), 1),  # small maps (batch innermost)
    ((2, 3, 8, 8), (2, 5, 5), (2, 2), (1, 1), 1),  # 5x5
]
IDS = [f"x{c[0]}-w{c[1]}-p{c[2]}-d{c[3]}-g{c[4]}" for c in CASES]
TOL = {np.float32: 2e-5, np.float64: 1e-12}


def _operands(case, dtype):
    rng = np.random.default_rng(3)
    x_shape, (o, kh, kw), padding, dilation, groups = case
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal((o, x_shape[1] // groups, kh, kw)).astype(dtype)
    win = backend_conv.check_conv(x, w, (1, 1), padding, dilation, groups)
    upstream = rng.standard_normal((x_shape[0], o, *win.out_hw)).astype(dtype)
    return x, w, upstream, win


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_input_gradient_as_forward_matches_col2im_and_torch(monkeypatch, case, dtype):
    monkeypatch.setattr(backend_conv, "DIRECT_FORCED", False)  # the paths compared here
    x, w, upstream, win = _operands(case, dtype)
    _, _, padding, dilation, groups = case
    geometry = ((1, 1), padding, dilation, groups)
    assert backend_conv._input_gradient_as_forward(win, groups, x.shape[0], x.shape[1],
                                                   w.shape[0])
    taken = []
    original = backend_conv.conv2d
    monkeypatch.setattr(backend_conv, "conv2d",
                        lambda *a, **k: (taken.append(a[0].shape), original(*a, **k))[1])
    got = backend_conv.conv2d_input_backward(upstream, w, x.shape, *geometry)
    assert taken == [upstream.shape]  # it went through conv2d
    monkeypatch.setattr(backend_conv, "_input_gradient_as_forward", lambda *a: False)
    want = backend_conv.conv2d_input_backward(upstream, w, x.shape, *geometry)
    assert taken == [upstream.shape]  # and here it did not
    assert got.dtype == dtype and got.shape == x.shape and got.flags.c_contiguous
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * scale)
    tx = torch.from_numpy(x).requires_grad_()
    ty = F.conv2d(tx, torch.from_numpy(w), padding=padding, dilation=dilation, groups=groups)
    ty.backward(torch.from_numpy(upstream))
    np.testing.assert_allclose(got, tx.grad.numpy(), rtol=TOL[dtype], atol=TOL[dtype] * scale)


def test_input_gradient_as_forward_writes_into_out():
    x, w, upstream, _ = _operands(CASES[0], np.float32)
    out = np.full(x.shape, np.nan, np.float32)
    got = backend_conv.conv2d_input_backward(upstream, w, x.shape, (1, 1), (1, 1), out=out)
    assert got is out and np.isfinite(out).all()


@pytest.mark.parametrize("c, o, stride, padding, expected", [
    (16, 16, 1, 1, True),
    (32, 16, 1, 1, True),  # fewer windows to copy than to fold
    (3, 16, 1, 1, False),  # a first layer: more to copy (measured 2.3x slower)
    (32, 64, 1, 1, True),  # more to copy, but Winograd takes it
    (16, 16, 2, 1, False),  # stride 2
    (16, 16, 1, 3, False),  # padding past the span: the correlation would crop
])
def test_the_rule_takes_stride_one_where_it_copies_less(c, o, stride, padding, expected):
    x = np.broadcast_to(np.zeros((), np.float32), (64, c, 16, 16))
    w = np.broadcast_to(np.zeros((), np.float32), (o, c, 3, 3))
    win = backend_conv.check_conv(x, w, (stride, stride), (padding, padding))
    assert backend_conv._input_gradient_as_forward(win, 1, 64, c, o) is expected


def test_input_gradient_padding_past_the_span_matches_torch():
    # The rule refuses it; the old way must still be right.
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2, 2, 3, 3))
    upstream = rng.standard_normal((1, 2, 8, 8))
    grad = backend_conv.conv2d_input_backward(upstream, w, (1, 2, 4, 4), (1, 1), (3, 3))
    tx = torch.zeros((1, 2, 4, 4), dtype=torch.float64, requires_grad=True)
    F.conv2d(tx, torch.from_numpy(w), padding=3).backward(torch.from_numpy(upstream))
    np.testing.assert_allclose(grad, tx.grad.numpy(), rtol=1e-12, atol=1e-12)
