"""Backend conv2d (dilation, groups, chunks over the batch, 1x1 windows) and its
backward kernels against PyTorch, against the BackwardOps defaults written in forward
ops, and on ThreadedCpuBackend; max_pool2d with dilation; and the errors bad
arguments raise."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pullback.backend import KernelError
from pullback.backend import conv as backend_conv

FLOATS = [np.float32, np.float64]
TOL = {np.float32: {"rtol": 1e-4, "atol": 1e-4}, np.float64: {"rtol": 1e-11, "atol": 1e-11}}

CONV_CASES = [
    # (N, C, H, W), (O, kh, kw), stride, padding, dilation, groups
    ((2, 3, 7, 6), (4, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((2, 4, 9, 8), (6, 3, 2), (2, 1), (1, 2), (2, 3), 2),
    ((3, 6, 6, 7), (6, 3, 3), (1, 2), (1, 1), (1, 1), 6),  # depthwise
    ((2, 4, 5, 5), (8, 1, 1), (1, 1), (0, 0), (1, 1), 2),  # 1x1: the input is the windows
    ((2, 4, 6, 6), (2, 1, 1), (2, 2), (1, 0), (1, 1), 1),  # 1x1 with stride and padding
    ((5, 2, 6, 5), (3, 3, 2), (1, 1), (2, 1), (2, 1), 1),
    # more im2col rows than pixels: the weight gradient takes one GEMM per chunk
    ((3, 8, 4, 4), (5, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((3, 8, 5, 4), (6, 3, 2), (2, 1), (1, 1), (1, 2), 2),
    ((2, 16, 3, 3), (4, 1, 1), (1, 1), (0, 0), (1, 1), 1),
]
IDS = [f"x{c[0]}-w{c[1]}-s{c[2]}-p{c[3]}-d{c[4]}-g{c[5]}" for c in CONV_CASES]


def _operands(rng, case, dtype):
    x_shape, (o, kh, kw), _, _, _, groups = case
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal((o, x_shape[1] // groups, kh, kw)).astype(dtype)
    return x, w


def _torch_conv(x, w, case):
    _, _, stride, padding, dilation, groups = case
    tx = torch.from_numpy(x).requires_grad_()
    tw = torch.from_numpy(w).requires_grad_()
    y = F.conv2d(tx, tw, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return tx, tw, y


@pytest.fixture(params=[None, 1], ids=["whole-batch", "chunks-of-one"])
def chunks(request, monkeypatch):
    """Run the batch in one chunk, or (CHUNK_BYTES tiny) one sample per chunk."""
    if request.param is not None:
        monkeypatch.setattr(backend_conv, "CHUNK_BYTES", request.param)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", CONV_CASES, ids=IDS)
def test_conv2d_and_its_backwards_match_torch(cpu, rng, case, dtype, chunks):
    x, w = _operands(rng, case, dtype)
    geometry = case[2:]
    y = cpu.conv2d(x, w, *geometry)
    tx, tw, ty = _torch_conv(x, w, case)
    assert y.dtype == dtype and y.flags.c_contiguous
    np.testing.assert_allclose(y, ty.detach().numpy(), **TOL[dtype])
    upstream = rng.standard_normal(y.shape).astype(dtype)
    ty.backward(torch.from_numpy(upstream))
    gx = cpu.conv2d_input_backward(upstream, w, x.shape, *geometry)
    gw = cpu.conv2d_weight_backward(upstream, x, w.shape, *geometry)
    assert gx.dtype == gw.dtype == dtype
    np.testing.assert_allclose(gx, tx.grad.numpy(), **TOL[dtype])
    np.testing.assert_allclose(gw, tw.grad.numpy(), **TOL[dtype])


@pytest.mark.parametrize("case", CONV_CASES, ids=IDS)
def test_conv2d_backwards_match_the_forward_op_defaults(cpu, forward_only, rng, case):
    x, w = _operands(rng, case, np.float64)
    geometry = case[2:]
    upstream = rng.standard_normal(cpu.conv2d(x, w, *geometry).shape)
    for fused, default in [
        (cpu.conv2d_input_backward(upstream, w, x.shape, *geometry),
         forward_only.conv2d_input_backward(upstream, w, x.shape, *geometry)),
        (cpu.conv2d_weight_backward(upstream, x, w.shape, *geometry),
         forward_only.conv2d_weight_backward(upstream, x, w.shape, *geometry)),
    ]:
        np.testing.assert_allclose(fused, default, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CONV_CASES[:3], ids=IDS[:3])
def test_threaded_backend_convolves_as_the_cpu_backend(cpu, threaded, rng, case):
    x, w = _operands(rng, case, np.float32)
    geometry = case[2:]
    y = cpu.conv2d(x, w, *geometry)
    np.testing.assert_array_equal(threaded.conv2d(x, w, *geometry), y)
    u = rng.standard_normal(y.shape).astype(np.float32)
    np.testing.assert_array_equal(threaded.conv2d_input_backward(u, w, x.shape, *geometry),
                                  cpu.conv2d_input_backward(u, w, x.shape, *geometry))
    np.testing.assert_array_equal(threaded.conv2d_weight_backward(u, x, w.shape, *geometry),
                                  cpu.conv2d_weight_backward(u, x, w.shape, *geometry))


def test_conv2d_reads_read_only_and_strided_operands(cpu, rng):
    x = rng.standard_normal((2, 5, 5, 3)).astype(np.float32).transpose(0, 3, 1, 2)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    x.flags.writeable = w.flags.writeable = False
    y = cpu.conv2d(x, w, (1, 1), (1, 1))
    np.testing.assert_allclose(y, cpu.conv2d(np.ascontiguousarray(x), w.copy(), (1, 1), (1, 1)))
    upstream = np.broadcast_to(np.float32(1.0), y.shape)  # as a mean's backward sends
    np.testing.assert_allclose(cpu.conv2d_weight_backward(upstream, x, w.shape, (1, 1), (1, 1)),
                               cpu.conv2d_weight_backward(np.ones(y.shape, np.float32), x,
                                                          w.shape, (1, 1), (1, 1)))


def test_unfold2d_and_fold2d_take_dilation(cpu, rng):
    x = rng.standard_normal((1, 2, 7, 7))
    cols = cpu.unfold2d(x, (2, 2), (1, 1), (1, 1), 0.0, (3, 2))
    want = F.unfold(torch.from_numpy(x), (2, 2), dilation=(3, 2), padding=1)
    np.testing.assert_array_equal(cols.reshape(want.shape), want.numpy())
    folded = cpu.fold2d(cols, x.shape, (2, 2), (1, 1), (1, 1), (3, 2))
    want = F.fold(want, (7, 7), (2, 2), dilation=(3, 2), padding=1)
    np.testing.assert_allclose(folded, want.numpy(), rtol=1e-12)


# ---------------------------------------------------------------- max_pool2d with dilation


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("kernel", "stride", "padding", "dilation"), [
    ((2, 2), (1, 1), (1, 1), (2, 2)),
    ((3, 2), (2, 1), (1, 0), (1, 3)),
    ((2, 2), (2, 2), (0, 0), (2, 1)),
])
def test_dilated_max_pool2d_matches_torch(cpu, forward_only, kernel, stride, padding, dilation,
                                          dtype):
    n = 2 * 2 * 7 * 8
    x = ((np.random.default_rng(3).permutation(n) - n / 2) * 0.1).reshape(2, 2, 7, 8)
    x = x.astype(dtype)  # distinct values: one maximum per window
    tx = torch.from_numpy(x).requires_grad_()
    ty = F.max_pool2d(tx, kernel, stride, padding, dilation)
    y = cpu.max_pool2d(x, kernel, stride, padding, dilation)
    np.testing.assert_array_equal(y, ty.detach().numpy())
    upstream = np.random.default_rng(4).standard_normal(y.shape).astype(dtype)
    ty.backward(torch.from_numpy(upstream))
    grad = cpu.max_pool2d_backward(upstream, x, y, kernel, stride, padding, dilation)
    np.testing.assert_allclose(grad, tx.grad.numpy(), **TOL[dtype])
    default = forward_only.max_pool2d_backward(upstream, x, y, kernel, stride, padding, dilation)
    np.testing.assert_allclose(grad, default, **TOL[dtype])


# ---------------------------------------------------------------- errors


def f32(*shape):
    return np.zeros(shape, np.float32)


ERRORS = [
    (lambda b: b.conv2d(f32(1, 4, 5, 5), f32(4, 2, 3, 3), (1, 1), (0, 0), (1, 1), 3),
     "conv2d: (1, 4, 5, 5) and (4, 2, 3, 3): groups 3 must divide both the input channels 4 "
     "and the output channels 4"),
    (lambda b: b.conv2d(f32(1, 4, 5, 5), f32(4, 4, 3, 3), (1, 1), (0, 0), (1, 1), 2),
     "weight has 4 input channels but input has 4 / groups 2 = 2"),
    (lambda b: b.conv2d(f32(1, 4, 5, 5), f32(4, 4, 3, 3), (1, 1), (0, 0), (1, 1), 0),
     "groups must be a positive int, not 0"),
    (lambda b: b.conv2d(f32(1, 4, 5, 5), f32(4, 4, 3, 3), (1, 1), (0, 0), (0, 1)),
     "dilation (0, 1) must be positive"),
    (lambda b: b.conv2d(f32(1, 1, 5, 5), f32(1, 1, 3, 3), (1, 1), (0, 0), (3, 1)),
     "kernel 3x3 dilated by (3, 1) (7x3) is larger than the padded input 5x5"),
    (lambda b: b.conv2d(np.zeros((1, 1, 5, 5), np.float16), np.zeros((1, 1, 3, 3), np.float16),
                        (1, 1), (0, 0)),
     "unsupported dtype float16; supported: float32, float64"),
    (lambda b: b.conv2d_input_backward(f32(1, 2, 3, 3), f32(2, 1, 3, 3), (1, 1, 4, 4), (1, 1),
                                       (0, 0)),
     "conv2d_input_backward: (1, 2, 3, 3) and (2, 1, 3, 3): expected an upstream of shape "
     "(1, 2, 2, 2)"),
    (lambda b: b.conv2d_weight_backward(f32(1, 2, 3, 3), f32(1, 1, 4, 4), (2, 1, 3, 3), (1, 1),
                                        (0, 0)),
     "conv2d_weight_backward: (1, 2, 3, 3) and (1, 1, 4, 4): expected an upstream of shape "
     "(1, 2, 2, 2)"),
    (lambda b: b.max_pool2d(f32(1, 1, 5, 5), (2, 2), (1, 1), (0, 0), (0, 2)),
     "max_pool2d: (1, 1, 5, 5): dilation (0, 2) must be positive"),
    (lambda b: b.max_pool2d_backward(f32(1, 1, 2, 2), f32(1, 1, 5, 5), f32(1, 1, 2, 2), (2, 2),
                                     (2, 2), (0, 0), (2, 4)),
     "max_pool2d_backward: (1, 1, 2, 2) and (1, 1, 5, 5) and (1, 1, 2, 2): expected upstream "
     "and output of shape (1, 1, 2, 1)"),
]


@pytest.mark.parametrize(("call", "text"), ERRORS, ids=[str(i) for i in range(len(ERRORS))])
def test_bad_arguments_raise_kernel_errors_naming_op_shapes_and_dtypes(cpu, call, text):
    with pytest.raises(KernelError) as info:
        call(cpu)
    assert text in str(info.value)
    assert "(dtype" in str(info.value)


def test_convolution_work_arrays_are_reused_per_thread_and_never_returned():
    import threading

    from pullback.backend import conv as window_ops

    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 4, 5, 5)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    up = rng.standard_normal((6, 8, 5, 5)).astype(np.float32)
    first = window_ops.conv2d(x, w, (1, 1), (1, 1))
    kept = first.copy()
    work = window_ops.scratch("windows", 16, np.float32)
    assert np.shares_memory(work, window_ops.scratch("windows", 8, np.float32))
    results = [first, window_ops.conv2d(2 * x, w, (1, 1), (1, 1)),
               window_ops.conv2d_input_backward(up, w, x.shape, (1, 1), (1, 1)),
               window_ops.conv2d_weight_backward(up, x, w.shape, (1, 1), (1, 1))]
    np.testing.assert_array_equal(first, kept)  # a later call left it alone
    np.testing.assert_allclose(results[1], 2 * kept, rtol=1e-5, atol=1e-5)
    pool = [window_ops.scratch(name, 1, dt) for name in ("windows", "products")
            for dt in (np.float32, np.float64)]
    assert not any(np.shares_memory(r, s.base if s.base is not None else s)
                   for r in results for s in pool)
    elsewhere = []
    thread = threading.Thread(
        target=lambda: elsewhere.append(window_ops.scratch("windows", 16, np.float32)))
    thread.start()
    thread.join()
    assert not np.shares_memory(elsewhere[0], work)  # each thread has its own
