"""Which convolutions run a sample at a time in register tiles (pullback.kernels.direct)
and that, through the backend's entry points, they give PyTorch's results: first layers
on small maps by default, any small-map stride-1 convolution when forced, the batch in
parts on BLAS's threads giving the whole batch's results bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pullback.backend import CpuBackend
from pullback.backend import conv as backend_conv


def _win(x_shape, w_shape, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    return backend_conv.check_conv(np.empty(x_shape), np.empty(w_shape), stride, padding,
                                   dilation, groups)


def test_first_layers_on_small_maps_run_direct_and_others_keep_their_paths(monkeypatch):
    assert backend_conv._direct(_win((8, 1, 8, 8), (16, 1, 3, 3)), 1, 1, 16)
    assert backend_conv._direct(_win((8, 3, 10, 10), (8, 3, 3, 3), padding=(1, 1)), 1, 3, 8)
    assert not backend_conv._direct(_win((8, 16, 6, 6), (32, 16, 3, 3)), 1, 16, 32)  # 144
    assert not backend_conv._direct(_win((8, 1, 32, 32), (8, 1, 3, 3)), 1, 1, 8)  # large
    assert not backend_conv._direct(_win((8, 1, 8, 8), (8, 1, 3, 3), stride=(2, 2)), 1, 1, 8)
    assert not backend_conv._direct(_win((8, 1, 9, 9), (8, 1, 3, 3), dilation=(2, 2)), 1, 1, 8)
    assert not backend_conv._direct(_win((8, 2, 8, 8), (8, 1, 3, 3), groups=2), 2, 2, 8)
    assert not backend_conv._direct(_win((8, 4, 8, 8), (8, 4, 1, 1)), 1, 4, 8)  # pointwise
    monkeypatch.setattr(backend_conv, "DIRECT_FORCED", True)
    assert backend_conv._direct(_win((8, 16, 6, 6), (32, 16, 3, 3)), 1, 16, 32)
    # Winograd's shapes stay Winograd's, forced or not.
    assert not backend_conv._direct(_win((8, 16, 8, 8), (16, 16, 3, 3), padding=(1, 1)), 1,
                                    16, 16)
    monkeypatch.setattr(backend_conv, "DIRECT_FORCED", False)
    assert not backend_conv._direct(_win((8, 1, 8, 8), (16, 1, 3, 3)), 1, 1, 16)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shapes", [((6, 16, 6, 6), (32, 16, 3, 3), 0),
                                    ((3, 32, 4, 4), (64, 32, 3, 3), 1),
                                    ((4, 2, 8, 8), (10, 2, 3, 3), 1)],
                         ids=["16to32", "32to64-pad1", "first-layer"])
def test_backend_convolutions_through_the_direct_path_match_torch(monkeypatch, shapes, dtype):
    monkeypatch.setattr(backend_conv, "DIRECT_FORCED", True)
    x_shape, w_shape, pad = shapes
    rng = np.random.default_rng(4)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    bias = rng.standard_normal(w_shape[0]).astype(dtype)
    taken = []
    for name in ("forward", "input_backward", "weight_backward"):
        original = getattr(backend_conv.direct, name)
        monkeypatch.setattr(backend_conv.direct, name,
                            lambda *a, _f=original, _n=name: (taken.append(_n), _f(*a))[1])
    cpu = CpuBackend()
    y = cpu.conv2d_epilogue(x, w, bias, None, None, None, True, (1, 1), (pad, pad))
    upstream = rng.standard_normal(y.shape).astype(dtype)
    grad = cpu.conv2d_input_backward(upstream, w, x.shape, (1, 1), (pad, pad))
    grad_w = cpu.conv2d_weight_backward(upstream, x, w.shape, (1, 1), (pad, pad))
    assert sorted(set(taken)) == ["forward", "input_backward", "weight_backward"]
    tx = torch.from_numpy(x).requires_grad_()
    tw = torch.from_numpy(w).requires_grad_()
    ty = F.conv2d(tx, tw, padding=pad)
    ty.backward(torch.from_numpy(upstream))
    want_y = torch.relu(ty.detach() + torch.from_numpy(bias).reshape(1, -1, 1, 1))
    tol = 1e-4 if dtype == np.float32 else 1e-11
    for got, want in ((y, want_y), (grad, tx.grad), (grad_w, tw.grad)):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want.numpy(), rtol=tol, atol=tol)


def test_a_direct_convolution_split_over_threads_gives_the_whole_batchs_results(monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((7, 2, 8, 8)).astype(np.float32)
    w = rng.standard_normal((12, 2, 3, 3)).astype(np.float32)
    upstream = rng.standard_normal((7, 12, 8, 8)).astype(np.float32)

    def three():
        return (backend_conv.conv2d(x, w, (1, 1), (1, 1)),
                backend_conv.conv2d_input_backward(upstream, w, x.shape, (1, 1), (1, 1)),
                backend_conv.conv2d_weight_backward(upstream, x, w.shape, (1, 1), (1, 1)))

    parts = []
    original = backend_conv.split.over_parts
    monkeypatch.setattr(backend_conv.split, "over_parts",
                        lambda n, run: (parts.append(n), original(n, run))[1])
    whole = three()
    assert not parts
    monkeypatch.setattr(backend_conv, "SPLIT_MACS", 0)
    split = three()
    assert parts == [7, 7, 7]
    for got, want in zip(split[:2], whole[:2]):  # a sample's results: the same bits
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(split[2], whole[2], rtol=1e-5, atol=1e-5)  # summed in parts
