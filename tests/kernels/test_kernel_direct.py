"""kernels.direct: small-map convolutions a sample at a time in register tiles, against
PyTorch in float32 and float64 (forward, input gradient, weight gradient) at the edges
of their tiling: maps whose pixels are not whole SIMD vectors, rows longer than a
vector, padding up to the kernel's size less one, output channels not a multiple of a
tile's rows, the weight gradient's samples in several chunks; against central
differences in float64; and the plain-Python bodies against the compiled ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pullback.kernels import direct

CASES = [
    # (N, C, H, W), (O, kh, kw), padding
    ((6, 1, 8, 8), (16, 3, 3), (0, 0)),  # a digits CNN's first layer: 6x6 = 36 pixels
    ((5, 4, 6, 6), (32, 3, 3), (0, 0)),  # its second: 4x4, 16 pixels
    ((3, 2, 8, 8), (13, 3, 3), (1, 1)),  # `pullback train`'s first layer, 13 channels
    ((2, 3, 7, 5), (6, 2, 3), (1, 2)),  # 6x7: rows shorter than a vector, uneven padding
    ((2, 2, 12, 13), (5, 3, 3), (0, 0)),  # 10x11: rows longer than a vector
    ((1, 3, 4, 4), (9, 3, 3), (2, 2)),  # padding = kernel - 1 (a full correlation)
    ((3, 1, 5, 5), (4, 5, 5), (2, 2)),  # a 5x5 kernel
]
IDS = [f"x{c[0]}-w{c[1]}-p{c[2]}" for c in CASES]
TOL = {np.float32: 2e-5, np.float64: 1e-12}


def _operands(case, dtype, seed=0):
    rng = np.random.default_rng(seed)
    x_shape, (o, kh, kw), padding = case
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal((o, x_shape[1], kh, kw)).astype(dtype)
    out_hw = (x_shape[2] + 2 * padding[0] - kh + 1, x_shape[3] + 2 * padding[1] - kw + 1)
    upstream = rng.standard_normal((x_shape[0], o, *out_hw)).astype(dtype)
    return x, w, upstream, direct.geometry((kh, kw), padding, out_hw)


def _torch(x, w, upstream, padding):
    tx = torch.from_numpy(x).requires_grad_()
    tw = torch.from_numpy(w).requires_grad_()
    y = F.conv2d(tx, tw, padding=padding)
    y.backward(torch.from_numpy(upstream))
    return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_direct_convolution_and_its_gradients_match_torch(monkeypatch, case, dtype):
    x, w, upstream, g = _operands(case, dtype)
    # Chunks of two samples' windows (and a last one of one) in the weight gradient.
    per_sample = w[0].size * upstream.shape[2] * upstream.shape[3] * x.itemsize
    monkeypatch.setattr(direct, "WEIGHT_WINDOWS_BYTES", 2 * per_sample)
    out = np.full(upstream.shape, np.nan, dtype)  # every value must be written
    grad = np.full(x.shape, np.nan, dtype)
    assert direct.forward(x, w, out, g) is out
    assert direct.input_backward(upstream, w, grad, g) is grad
    grad_w = direct.weight_backward(upstream, x, w.shape, g)
    assert grad_w.shape == w.shape and grad_w.dtype == dtype
    for got, want in zip((out, grad, grad_w), _torch(x, w, upstream, case[2])):
        scale = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


@pytest.mark.parametrize("case", CASES[1:4], ids=IDS[1:4])
def test_direct_gradients_match_central_differences(case):
    x, w, upstream, g = _operands(case, np.float64, seed=1)

    def loss(x_, w_):
        out = np.empty(upstream.shape)
        return float((direct.forward(x_, w_, out, g) * upstream).sum())

    grad = direct.input_backward(upstream, w, np.empty_like(x), g)
    grad_w = direct.weight_backward(upstream, x, w.shape, g)
    eps = 1e-6
    for array, analytic in ((x, grad), (w, grad_w)):
        flat = array.reshape(-1)
        for at in np.random.default_rng(2).choice(flat.size, 12, replace=False):
            keep = flat[at]
            flat[at] = keep + eps
            up = loss(x, w)
            flat[at] = keep - eps
            down = loss(x, w)
            flat[at] = keep
            assert (up - down) / (2 * eps) == pytest.approx(analytic.reshape(-1)[at],
                                                            rel=1e-6, abs=1e-7)


def test_plain_python_bodies_agree_with_the_compiled_kernels():
    """The bodies run as plain Python (their helpers' meanings: runs copied value by
    value, tiles as loops) give the compiled kernels' results."""
    case = ((2, 2, 6, 5), (7, 3, 3), (1, 0))
    x, w, upstream, g = _operands(case, np.float32)
    o, k = w.shape[0], w[0].size
    pixels = upstream.shape[2] * upstream.shape[3]
    q = direct.columns(pixels, x.dtype)
    padded = direct._padded(x, g)
    out = np.empty((len(x), o, pixels), np.float32)
    direct.forward_body(x, w.reshape(o, -1), out, np.empty((k, q), np.float32),
                        np.empty((o, q), np.float32), padded, g)
    compiled = direct.forward(x, w, np.empty(upstream.shape, np.float32), g)
    np.testing.assert_allclose(out.reshape(compiled.shape), compiled, rtol=1e-6, atol=1e-5)
    grad = np.empty_like(x)
    scratch = np.zeros((o, q), np.float32)
    direct.input_backward_body(upstream.reshape(len(x), o, pixels),
                               np.ascontiguousarray(w.reshape(o, -1).T), grad,
                               np.empty((k, q), np.float32), scratch, g)
    np.testing.assert_allclose(grad, direct.input_backward(upstream, w, np.empty_like(x), g),
                               rtol=1e-6, atol=1e-5)
    grad_t = np.zeros((k, direct.columns(o, x.dtype)), np.float32)
    direct.weight_backward_body(upstream.reshape(len(x), o, pixels), x, grad_t,
                                np.empty((k, pixels + direct.SLACK), np.float32),
                                np.zeros((pixels, grad_t.shape[1]), np.float32), padded, g)
    np.testing.assert_allclose(grad_t[:, :o].T.reshape(w.shape),
                               direct.weight_backward(upstream, x, w.shape, g),
                               rtol=1e-6, atol=1e-5)


def test_kept_buffers_serve_calls_of_every_shape_in_turn():
    """A thread's buffers are kept from call to call: calls of many shapes in turn (the
    same sizes with other borders among them) each give PyTorch's results."""
    rng = np.random.default_rng(8)
    # Padded samples of one size, their borders in other places: 5x7 padded by (2, 1)
    # and 7x5 by (1, 2) are both 9x9.
    for x_shape, pad in (((1, 1, 5, 7), (2, 1)), ((1, 1, 7, 5), (1, 2)), ((1, 1, 5, 7), (2, 1))):
        x = rng.standard_normal(x_shape).astype(np.float32)
        weight = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
        out_hw = (x_shape[2] + 2 * pad[0] - 2, x_shape[3] + 2 * pad[1] - 2)
        got = direct.forward(x, weight, np.empty((1, 2, *out_hw), np.float32),
                             direct.geometry((3, 3), pad, out_hw))
        want = F.conv2d(torch.from_numpy(x), torch.from_numpy(weight), padding=pad).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    for _ in range(24):
        c, h, w, pad = (int(v) for v in rng.integers((1, 3, 3, 0), (5, 9, 9, 3)))
        o, n = int(rng.integers(1, 20)), int(rng.integers(1, 5))
        x = rng.standard_normal((n, c, h, w)).astype(np.float32)
        weight = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
        out_hw = (h + 2 * pad - 2, w + 2 * pad - 2)
        upstream = rng.standard_normal((n, o, *out_hw)).astype(np.float32)
        g = direct.geometry((3, 3), (pad, pad), out_hw)
        got = (direct.forward(x, weight, np.empty(upstream.shape, np.float32), g),
               direct.input_backward(upstream, weight, np.empty_like(x), g),
               direct.weight_backward(upstream, x, weight.shape, g))
        for value, want in zip(got, _torch(x, weight, upstream, (pad, pad))):
            np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_a_kernel_is_named_after_the_files_compiled_into_it(tmp_path, monkeypatch):
    """jit.depending_on: Numba's disk cache keys a kernel by its own file, so a kernel
    that compiles in another file's intrinsics (the tiles') carries that file's stamp in
    its name, and an edit there gives it a new name (a fresh compile, not stale code)."""
    import importlib.util
    import os

    from pullback.kernels import jit

    path = tmp_path / "other_kernels.py"
    path.write_text("X = 1\n")
    spec = importlib.util.spec_from_file_location("other_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def body(x):
        return x

    first = jit.depending_on(jit.rebound(body, {}), module).__qualname__
    assert first.startswith(body.__qualname__ + "_")
    assert jit.depending_on(jit.rebound(body, {}), module).__qualname__ == first
    path.write_text("X = 2  # edited\n")
    os.utime(path, ns=(1, 1))
    assert jit.depending_on(jit.rebound(body, {}), module).__qualname__ != first
    compiled = direct.compiled(direct.forward_body, np.dtype(np.float32))
    assert compiled.py_func.__qualname__.startswith("forward_body_")
