"""optim.clip_grad_norm against torch.nn.utils.clip_grad_norm_."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from optim_oracle import initial_values, random_grads

import pullback as pb
from pullback import optim


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize(("max_norm", "norm_type"), [(1.0, 2.0), (100.0, 2.0), (0.5, math.inf),
                                                     (2.0, 1.5)])
def test_clip_grad_norm_matches_torch(max_norm: float, norm_type: float, dtype: type) -> None:
    values = initial_values(dtype)
    grads = random_grads(values, steps=1, scale=2.0)[0]
    params = [pb.tensor(v, requires_grad=True) for v in values]
    tparams = [torch.tensor(v, requires_grad=True) for v in values]
    for p, t, g in zip(params, tparams, grads):
        p.grad, t.grad = pb.tensor(g.copy()), torch.tensor(g.copy())
    params.append(pb.ones(2, requires_grad=True))  # no gradient: skipped, as in torch
    grad_objects = [p.grad for p in params[:-1]]
    total = optim.clip_grad_norm(params, max_norm, norm_type)
    expected = torch.nn.utils.clip_grad_norm_(tparams, max_norm, norm_type)
    rtol = 1e-6 if dtype == np.float32 else 1e-12
    assert total.shape == () and total.dtype == dtype
    np.testing.assert_allclose(float(total), expected.item(), rtol=rtol)
    for p, t, g in zip(params, tparams, grad_objects):
        assert p.grad is g  # scaled in place
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=rtol, atol=1e-7)
    assert params[-1].grad is None


def test_clip_grad_norm_takes_one_tensor_and_no_gradients() -> None:
    p = pb.tensor([3.0, 4.0], requires_grad=True)
    assert float(optim.clip_grad_norm(p, 1.0)) == 0.0
    p.grad = pb.tensor([3.0, 4.0])
    assert float(optim.clip_grad_norm(p, 1.0)) == 5.0
    np.testing.assert_allclose(p.grad.numpy(), [0.6, 0.8], rtol=1e-6)


def test_a_non_finite_norm_raises_only_when_asked() -> None:
    p = pb.tensor([1.0, 2.0], requires_grad=True)
    p.grad = pb.tensor([math.inf, 1.0])
    with pytest.raises(RuntimeError, match=r"clip_grad_norm: the total 2\.0-norm .* is inf"):
        optim.clip_grad_norm([p], 1.0, error_if_nonfinite=True)
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    t.grad = torch.tensor([math.inf, 1.0])
    torch.nn.utils.clip_grad_norm_([t], 1.0)
    assert math.isinf(float(optim.clip_grad_norm([p], 1.0)))
    np.testing.assert_array_equal(p.grad.numpy(), t.grad.numpy())


def test_clip_grad_norm_rejects_bad_arguments() -> None:
    p = pb.tensor([1.0], requires_grad=True)
    with pytest.raises(ValueError, match="clip_grad_norm: max_norm must be"):
        optim.clip_grad_norm([p], -1.0)
    with pytest.raises(ValueError, match="clip_grad_norm: norm_type must be"):
        optim.clip_grad_norm([p], 1.0, norm_type=0)
    with pytest.raises(TypeError, match="clip_grad_norm: parameter 0 is a ndarray"):
        optim.clip_grad_norm([np.ones(2)], 1.0)
