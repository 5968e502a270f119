"""Zero-size tensors behave as in PyTorch: empty batches through conv2d, pools, matmul
and cross_entropy, forward and backward, with gradients of the right shapes."""

from __future__ import annotations

import numpy as np
import torch

import pullback as pb
from pullback import nn


def test_conv2d_and_pools_of_an_empty_batch_give_empty_outputs_and_zero_gradients() -> None:
    x = pb.zeros(0, 2, 5, 5, requires_grad=True)
    w = pb.randn(3, 2, 3, 3, seed=0, requires_grad=True)
    b = pb.zeros(3, requires_grad=True)
    y = pb.conv2d(x, w, b, padding=1)
    tx = torch.zeros(0, 2, 5, 5)
    assert y.shape == tuple(torch.nn.functional.conv2d(tx, torch.zeros(3, 2, 3, 3),
                                                       padding=1).shape) == (0, 3, 5, 5)
    loss = pb.max_pool2d(y, 2).sum() + pb.avg_pool2d(y, 2).sum()
    loss.backward()
    assert x.grad.shape == (0, 2, 5, 5)
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros((3, 2, 3, 3), np.float32))
    np.testing.assert_array_equal(b.grad.numpy(), np.zeros(3, np.float32))


def test_conv2d_with_no_input_channels_gives_zeros() -> None:
    y = pb.conv2d(pb.zeros(2, 0, 4, 4), pb.zeros(3, 0, 3, 3))
    np.testing.assert_array_equal(y.numpy(), np.zeros((2, 3, 2, 2), np.float32))


def test_matmul_over_an_empty_inner_dimension_gives_zeros_and_empty_gradients() -> None:
    a = pb.zeros(2, 0, requires_grad=True)
    b = pb.zeros(0, 3, requires_grad=True)
    y = a @ b
    np.testing.assert_array_equal(y.numpy(), np.zeros((2, 3), np.float32))
    y.sum().backward()
    assert a.grad.shape == (2, 0) and b.grad.shape == (0, 3)
    batched = pb.zeros(4, 2, 0, requires_grad=True)
    (batched @ b).sum().backward()
    assert batched.grad.shape == (4, 2, 0)


def test_matmul_of_an_empty_batch_gives_a_zero_weight_gradient() -> None:
    x = pb.zeros(0, 4)
    w = pb.ones(4, 3, requires_grad=True)
    y = x @ w
    assert y.shape == (0, 3)
    y.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.zeros((4, 3), np.float32))


def test_cross_entropy_of_an_empty_batch_is_nan_with_an_empty_gradient_as_pytorch() -> None:
    logits = pb.zeros(0, 3, requires_grad=True)
    loss = nn.cross_entropy(logits, np.zeros(0, np.int64))
    t = torch.zeros(0, 3, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(t, torch.zeros(0, dtype=torch.long))
    assert np.isnan(loss.item()) and torch.isnan(expected)
    loss.backward()
    expected.backward()
    assert logits.grad.shape == tuple(t.grad.shape) == (0, 3)
