"""Bad operands and arguments are refused with a KernelError (or ValueError) that names
the op the user called, the shapes and the dtypes: never an AttributeError, a bare
TypeError or the name of an internal helper."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback import nn

X = pb.ones(2, 2)


@pytest.mark.parametrize("call, op", [
    (lambda: pb.matmul(X, None), "matmul"),
    (lambda: None @ X, "matmul"),
    (lambda: X @ 2.0, "matmul"),
    (lambda: pb.add(X, None), "add"),
    (lambda: X * "a", "mul"),
    (lambda: X * [1.0, 2.0], "mul"),
    (lambda: pb.exp(None), "exp"),
    (lambda: pb.sum(None), "sum"),
    (lambda: pb.where(X > 0, X, None), "where"),
    (lambda: pb.concatenate([X, None], 0), "concatenate"),
    (lambda: pb.conv2d(pb.ones(1, 1, 3, 3), None), "conv2d"),
    (lambda: pb.reshape(2.0, 3.0), "reshape"),
    (lambda: X.reshape(2.5, 1), "reshape"),
], ids=["matmul_none", "rmatmul_none", "matmul_scalar", "add_none", "mul_str", "mul_list",
        "exp_none", "sum_none", "where_none", "concatenate_none", "conv2d_none",
        "reshape_floats", "reshape_float_dim"])
def test_bad_operands_raise_kernel_error_naming_the_op(call, op) -> None:
    with pytest.raises(pb.KernelError, match=rf"^{op}: "):
        call()


def test_matmul_backward_with_bad_shapes_names_matmul_backward() -> None:
    up = np.ones((3, 5), np.float32)
    lhs, rhs = np.ones((3, 4), np.float32), np.ones((4, 2), np.float32)
    backend = pb.get_backend()
    for kernel in (backend.matmul_backward,
                   lambda *a: pb.BackwardOps.matmul_backward(backend, *a)):
        with pytest.raises(pb.KernelError,
                           match=r"^matmul_backward: .*upstream has shape \(3, 5\) but lhs @ "
                                 r"rhs has shape \(3, 2\)"):
            kernel(up, lhs, rhs)
        with pytest.raises(pb.KernelError, match=r"^matmul_backward: .*inner dimensions"):
            kernel(up, lhs, np.ones((5, 2), np.float32))


@pytest.mark.parametrize("kernel", ["conv2d_input_backward", "conv2d_weight_backward"])
def test_conv2d_backward_kernels_name_themselves_in_errors(kernel) -> None:
    backend = pb.get_backend()
    up = np.ones((1, 2, 3, 3), np.float32)
    x, w = np.ones((1, 3, 5, 5), np.float32), np.ones((2, 4, 3, 3), np.float32)
    with pytest.raises(pb.KernelError, match=rf"^{kernel}: .*input channels"):
        if kernel == "conv2d_input_backward":
            backend.conv2d_input_backward(up, w, x.shape, (1, 1), (0, 0))
        else:
            backend.conv2d_weight_backward(up, x, w.shape, (1, 1), (0, 0))


def test_cross_entropy_errors_name_shapes_and_dtypes() -> None:
    with pytest.raises(pb.KernelError, match=r"^cross_entropy: \(2, 4\) and \(2,\): labels "
                                             r"must be integers \(dtypes float32 and float64\)"):
        nn.cross_entropy(pb.zeros(2, 4), np.array([0.0, 1.0]))
    with pytest.raises(pb.KernelError, match=r"^cross_entropy: .*\(dtypes float32 and int64\)"):
        nn.cross_entropy(pb.zeros(2, 4), np.array([0, 9]))


@pytest.mark.parametrize("make, match", [
    (lambda: nn.Dense(-1, 3), "^Dense: in_features must be a non-negative int, got -1"),
    (lambda: nn.Dense(3, 2.5), "^Dense: out_features"),
    (lambda: nn.Conv2d(-2, 3, 3), "^Conv2d: in_channels"),
], ids=["dense_negative", "dense_float", "conv_negative"])
def test_layer_sizes_are_checked_by_name(make, match) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_float16_tensors_cannot_require_grad() -> None:
    t = pb.from_numpy(np.zeros(2, np.float32)).astype(np.float16)
    with pytest.raises(TypeError, match="only float32 and float64"):
        t.requires_grad = True
