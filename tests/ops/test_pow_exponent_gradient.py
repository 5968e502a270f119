"""The gradient of a**b with respect to the exponent b, against PyTorch: NaN for a
negative base (its log is not real), 0 or -inf at a zero base."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb

EXPONENTS = np.array([2.0, 0.0, -1.0, 0.5, 3.0], np.float32)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy warns of (-2) ** 0.5
@pytest.mark.parametrize("base", [-2.0, 0.0, 3.0], ids=["negative", "zero", "positive"])
def test_exponent_gradient_of_a_python_base_matches_pytorch(base) -> None:
    t = pb.tensor(EXPONENTS, requires_grad=True)
    (base**t).sum().backward()
    tt = torch.tensor(EXPONENTS, requires_grad=True)
    (base**tt).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-6)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_exponent_gradient_of_a_tensor_base_matches_pytorch() -> None:
    bases = np.array([-2.0, 0.0, 0.0, 4.0, -1.0], np.float32)
    t = pb.tensor(EXPONENTS, requires_grad=True)
    (pb.tensor(bases) ** t).sum().backward()
    tt = torch.tensor(EXPONENTS, requires_grad=True)
    (torch.tensor(bases) ** tt).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-6)
    assert np.isnan(t.grad.numpy()[0])  # was 0: a silent wrong gradient
