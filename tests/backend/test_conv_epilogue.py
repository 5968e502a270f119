"""`conv2d_epilogue`: CpuBackend's, applied to each chunk of the output inside the
convolution's loops, is bit for bit FusedOps' defaults (the ops one by one) on every
convolution path, and NumPy's relu(((conv + bias) * scale + shift) + residual) by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pullback.backend import CpuBackend, KernelError
from pullback.backend.fused import _Defaults

# (x shape, weight shape, stride, padding): a 1x1 convolution (one GEMM for the batch),
# small maps over several samples (one GEMM per chunk), a 32x32 map (a GEMM per sample),
# 32 channels into 32 on two 16x16 maps (Winograd), 6x6 maps with the batch innermost
# (small maps), and a sample at a time (3 channels: pullback.kernels.direct).
PATHS = [((2, 4, 3, 3), (5, 4, 1, 1), 1, 0), ((3, 2, 5, 5), (3, 2, 3, 3), 2, 1),
         ((2, 1, 32, 32), (2, 1, 3, 3), 1, 1), ((2, 32, 16, 16), (32, 32, 3, 3), 1, 1),
         ((4, 8, 8, 8), (5, 8, 3, 3), 1, 0), ((4, 3, 8, 8), (5, 3, 3, 3), 1, 0)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shapes", PATHS)
def test_epilogue_is_the_ops_one_by_one(shapes, dtype):
    x_shape, w_shape, stride, padding = shapes
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    backend = CpuBackend()
    conv = backend.conv2d(x, w, (stride, stride), (padding, padding))
    scale = rng.standard_normal(w_shape[0]).astype(dtype)
    bias = rng.standard_normal(w_shape[0]).astype(dtype)
    residual = rng.standard_normal(conv.shape).astype(dtype)
    residual.flat[::7] = np.nan  # NaN stays NaN through relu
    shift = rng.standard_normal(w_shape[0]).astype(dtype)
    for b, s, t, r, relu in ((bias, scale, shift, residual, True), (bias, None, None, None, True),
                             (None, scale, shift, residual, False)):
        args = (x, w, b, s, t, r, relu, (stride, stride), (padding, padding))
        out = np.empty_like(conv)
        got = backend.conv2d_epilogue(*args, out=out)
        assert got is out
        expected = conv + (0 if b is None else b.reshape(1, -1, 1, 1))
        expected = expected * (1 if s is None else s.reshape(1, -1, 1, 1))
        expected = expected + (0 if t is None else t.reshape(1, -1, 1, 1))
        expected = expected + (0 if r is None else r)
        if relu:
            expected = np.where(expected <= 0, 0, expected)
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(_Defaults(backend).conv2d_epilogue(*args), expected)


def test_epilogue_refuses_a_residual_of_another_shape():
    x = np.ones((1, 2, 4, 4), np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    with pytest.raises(KernelError, match=r"conv2d: .*the residual must be \(1, 3, 2, 2\)"):
        CpuBackend().conv2d_epilogue(x, w, None, None, None,
                                     np.ones((1, 3, 4, 4), np.float32), True, (1, 1), (0, 0))


def test_a_convolution_path_without_epilogue_still_gets_it(monkeypatch):
    """A path of backend/conv.py's conv2d that ignores `epilogue` (a new one, say): the
    epilogue then runs once over its output."""
    from pullback.backend import conv as window_ops

    plain = window_ops.conv2d
    monkeypatch.setattr(window_ops, "conv2d", lambda *args, epilogue=None, **kwargs: plain(
        *args, **kwargs))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 4))
    w = rng.standard_normal((2, 3, 3, 3))
    bias = rng.standard_normal(2)
    got = CpuBackend().conv2d_epilogue(x, w, bias, None, None, None, True, (1, 1), (1, 1))
    expected = plain(x, w, (1, 1), (1, 1)) + bias.reshape(1, -1, 1, 1)
    np.testing.assert_array_equal(got, np.where(expected <= 0, 0, expected))
