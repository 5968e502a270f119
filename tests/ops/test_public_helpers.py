"""`pb.erf`, `pb.sign` and `pb.one_hot`, public as API.md lists them, against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_and_its_gradient_match_torch(dtype) -> None:
    a = np.random.default_rng(0).standard_normal((3, 4)).astype(dtype)
    x = pb.tensor(a, requires_grad=True)
    xt = torch.tensor(a, requires_grad=True)
    y, yt = pb.erf(x), torch.erf(xt)
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-6)
    y.sum().backward()
    yt.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5)


def test_sign_matches_torch_and_records_nothing() -> None:
    a = np.array([-2.0, 0.0, 3.5])
    x = pb.tensor(a, requires_grad=True)
    y = pb.sign(x)
    np.testing.assert_array_equal(y.numpy(), torch.sign(torch.tensor(a)).numpy())
    assert not y.requires_grad


@pytest.mark.parametrize("num_classes", [-1, 5])
def test_one_hot_matches_torch(num_classes: int) -> None:
    labels = np.array([[0, 3], [2, 1]])
    got = pb.one_hot(pb.tensor(labels), num_classes)
    want = torch.nn.functional.one_hot(torch.tensor(labels), num_classes)
    assert got.dtype == pb.int64
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    floats = pb.one_hot(pb.tensor(labels), num_classes, dtype=pb.float32)
    assert floats.dtype == pb.float32
    np.testing.assert_array_equal(floats.numpy(), want.numpy())


@pytest.mark.parametrize(("labels", "num_classes", "message"), [
    (np.array([0, 2]), 2, r"class values must be in \[0, 2\), got 0 to 2"),
    (np.array([-1, 0]), 3, r"class values must be in \[0, 3\)"),
    (np.array([0.5]), -1, "labels must be an integer tensor"),
    (np.array([1]), 2.5, "num_classes must be a non-negative int or -1"),
])
def test_one_hot_refuses_what_torch_refuses_naming_itself(labels, num_classes, message) -> None:
    with pytest.raises(pb.KernelError, match=rf"^one_hot: .*{message}"):
        pb.one_hot(pb.tensor(labels), num_classes)
