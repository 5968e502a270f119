"""Every invalid call raises KernelError naming the op and the shapes, never a raw
NumPy error."""

from __future__ import annotations

import numpy as np
import pytest

from pullback.backend import Backend, CpuBackend, KernelError

f32 = lambda *shape: np.ones(shape, dtype=np.float32)
i32 = lambda *shape: np.ones(shape, dtype=np.int32)

ERRORS = [
    # (call, op name, text the message must contain)
    (lambda b: b.add(f32(3), f32(4)), "add",
     "add: (3,) and (4,): shapes cannot be broadcast together (dtypes float32 and float32)"),
    (lambda b: b.less(f32(2, 3), f32(4)), "less", "less: (2, 3) and (4,)"),
    (lambda b: b.pow(i32(3), -1), "pow", "pow: (3,) and ()"),
    (lambda b: b.sub(np.ones(2, bool), np.ones(2, bool)), "sub", "sub: (2,) and (2,)"),
    (lambda b: b.where(f32(3) > 0, f32(4), 0.0), "where", "where: (3,) and (4,) and ()"),
    (lambda b: b.matmul(f32(3, 4), f32(5, 2)), "matmul",
     "matmul: (3, 4) and (5, 2): inner dimensions 4 and 5 differ"),
    (lambda b: b.matmul(f32(2, 3, 4), f32(3, 4, 5)), "matmul",
     "batch dimensions (2,) and (3,) cannot be broadcast"),
    (lambda b: b.matmul(f32(4), np.float32(2.0)), "matmul", "at least one dimension"),
    (lambda b: b.exp(i32(3)), "exp", "exp: (3,): expected a floating dtype (dtype int32)"),
    (lambda b: b.sigmoid(i32(3)), "sigmoid", "expected a floating dtype"),
    (lambda b: b.gelu(i32(3)), "gelu", "expected a floating dtype"),
    (lambda b: b.gelu(f32(3), approximate="cubic"), "gelu", "approximate must be"),
    (lambda b: b.gelu_backward(f32(3), f32(3), "cubic"), "gelu_backward",
     "approximate must be"),
    (lambda b: b.softmax(i32(2, 3), 1), "softmax", "expected a floating dtype"),
    (lambda b: b.softmax(f32(2, 3), 2), "softmax", "out of range"),
    (lambda b: b.neg(np.ones(2, bool)), "neg", "neg: (2,): unsupported dtype bool"),
    (lambda b: b.transpose(f32(2, 3), (0, 0)), "transpose", "transpose: (2, 3): axes (0, 0)"),
    (lambda b: b.transpose(f32(2, 3), (1, 0, 2)), "transpose", "do not match 2 dims"),
    (lambda b: b.reshape(f32(2, 3), (4,)), "reshape",
     "reshape: (2, 3): cannot reshape 6 elements into shape (4,)"),
    (lambda b: b.broadcast_to(f32(3), (4,)), "broadcast_to", "cannot broadcast to shape (4,)"),
    (lambda b: b.sum_to_shape(f32(2, 3), (4,)), "sum_to_shape", "cannot sum to shape (4,)"),
    (lambda b: b.reduce_sum(f32(2, 3), (2,), False), "reduce_sum", "out of range"),
    (lambda b: b.reduce_max(f32(0, 3), (0,), False), "reduce_max", "empty axis"),
    (lambda b: b.getitem(f32(2, 3), 5), "getitem", "getitem: (2, 3): invalid index [5]"),
    (lambda b: b.getitem(f32(2, 3), np.array([0, 7])), "getitem", "array(2,):int64"),
    (lambda b: b.scatter_add(f32(3), np.array([0, 9, 1]), (4,)), "scatter_add",
     "into shape (4,)"),
    (lambda b: b.concatenate([f32(2, 3), f32(2, 4)], 0), "concatenate",
     "concatenate: (2, 3) and (2, 4)"),
    (lambda b: b.pad2d(f32(3), (1, 1)), "pad2d", "at least 2 dims"),
    (lambda b: b.pad2d(i32(2, 2), (1, 1), -np.inf), "pad2d", "cannot pad with -inf"),
    (lambda b: b.astype(f32(2), "not-a-dtype"), "astype", "cannot convert"),
    (lambda b: b.asarray([[1, 2], [3]]), "asarray", "cannot make an array"),
    (lambda b: b.conv2d(f32(1, 4, 5, 5), f32(2, 3, 3, 3), (1, 1), (0, 0)), "conv2d",
     "conv2d: (1, 4, 5, 5) and (2, 3, 3, 3): weight has 3 input channels but input has 4"),
    (lambda b: b.conv2d(f32(4, 5, 5), f32(2, 4, 3, 3), (1, 1), (0, 0)), "conv2d",
     "expected 4-D input"),
    (lambda b: b.conv2d(f32(1, 1, 5, 5), np.ones((1, 1, 3, 3)), (1, 1), (0, 0)), "conv2d",
     "dtypes differ (dtypes float32 and float64)"),
    (lambda b: b.conv2d(i32(1, 1, 5, 5), i32(1, 1, 3, 3), (1, 1), (0, 0)), "conv2d",
     "expected a floating dtype"),
    (lambda b: b.conv2d(f32(1, 1, 3, 3), f32(1, 1, 5, 5), (1, 1), (0, 0)), "conv2d",
     "kernel 5x5 is larger than the padded input 3x3"),
    (lambda b: b.conv2d(f32(1, 1, 5, 5), f32(1, 1, 3, 3), (0, 1), (0, 0)), "conv2d",
     "stride (0, 1) must be positive"),
    (lambda b: b.unfold2d(f32(1, 1, 5, 5), (3, 3), (1, 1), (-1, 0)), "unfold2d",
     "padding (-1, 0) must be non-negative"),
    (lambda b: b.fold2d(f32(1, 1, 3, 3, 3, 3), (1, 1, 4, 4), (3, 3), (1, 1), (0, 0)), "fold2d",
     "expected windows of shape (1, 1, 3, 3, 2, 2)"),
    (lambda b: b.max_pool2d(f32(1, 1, 5), (2, 2), (2, 2), (0, 0)), "max_pool2d", "4-D"),
    (lambda b: b.max_pool2d(f32(1, 1, 5, 5), (2, 2), (2, 2), (2, 2)), "max_pool2d",
     "more than half the kernel"),
    (lambda b: b.avg_pool2d(i32(1, 1, 4, 4), (2, 2), (2, 2), (0, 0)), "avg_pool2d",
     "expected a floating dtype"),
]


@pytest.mark.parametrize(("call", "op", "text"), ERRORS, ids=[f"{e[1]}-{i}" for i, e in
                                                              enumerate(ERRORS)])
def test_invalid_call_raises_kernel_error(call, op, text):
    with pytest.raises(KernelError) as info:
        call(CpuBackend())
    assert info.value.op == op
    assert str(info.value).startswith(f"{op}: ")
    assert text in str(info.value)


def test_default_gelu_backward_rejects_unknown_mode(forward_only):
    with pytest.raises(KernelError, match=r"gelu_backward: .*approximate must be"):
        forward_only.gelu_backward(f32(3), f32(3), "cubic")


def test_fold2d_with_the_wrong_window_shape_names_both(cpu):
    with pytest.raises(KernelError, match="fold2d: \\(1, 1, 2, 2, 2, 2\\)"):
        cpu.fold2d(f32(1, 1, 2, 2, 2, 2), (1, 1, 4, 4), (3, 3), (1, 1), (0, 0))


@pytest.mark.parametrize("op", ["matmul", "add", "relu", "conv2d", "zeros"])
def test_bare_backend_reports_unimplemented_ops(op):
    with pytest.raises(KernelError, match=f"{op}: backend abstract does not implement {op}"):
        method = getattr(Backend(), op)
        method(*([None] * (method.__code__.co_argcount - 1)))


def test_kernel_error_is_a_value_error_with_shapes_and_dtypes(cpu):
    with pytest.raises(ValueError) as info:
        cpu.mul(f32(2, 3), np.ones((4,)))
    assert info.value.shapes == ((2, 3), (4,))
    assert info.value.dtypes == ("float32", "float64")
