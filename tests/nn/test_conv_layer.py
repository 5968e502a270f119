"""nn.Conv2d with dilation and groups against torch.nn.Conv2d (same weights): the
forward, gradients by autograd and by the layer's own backprop, PyTorch's
initialization bound (fan_in = in / groups * kh * kw), and its argument errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback import nn

DTYPES = {"f32": (np.float32, torch.float32, 1e-5), "f64": (np.float64, torch.float64, 1e-11)}
CONFIGS = {
    "dilation": dict(in_channels=3, out_channels=4, kernel_size=3, padding=2, dilation=2),
    "groups": dict(in_channels=4, out_channels=6, kernel_size=(3, 2), stride=(2, 1), groups=2),
    "depthwise": dict(in_channels=4, out_channels=4, kernel_size=3, padding=1, groups=4,
                      bias=False),
    "everything": dict(in_channels=6, out_channels=3, kernel_size=(2, 3), stride=(1, 2),
                       padding=(1, 2), dilation=(3, 1), groups=3),
}


def _pair(module: nn.Conv2d, config: dict, torch_dtype: torch.dtype) -> torch.nn.Conv2d:
    tmodule = torch.nn.Conv2d(**config).to(torch_dtype)
    with torch.no_grad():
        tmodule.weight.copy_(torch.from_numpy(module.weight.numpy().copy()))
        if module.bias is not None:
            tmodule.bias.copy_(torch.from_numpy(module.bias.numpy().copy()))
    return tmodule


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", CONFIGS)
def test_conv2d_layer_matches_torch(name: str, dtype: str) -> None:
    np_dtype, torch_dtype, tol = DTYPES[dtype]
    config = CONFIGS[name]
    pb.manual_seed(0)
    module = nn.Conv2d(**config, dtype=np_dtype)
    tmodule = _pair(module, config, torch_dtype)
    x0 = np.random.default_rng(1).standard_normal((2, config["in_channels"], 7, 8))
    x0 = x0.astype(np_dtype)
    x = pb.tensor(x0, requires_grad=True)
    xt = torch.tensor(x0, requires_grad=True)
    y, yt = module(x), tmodule(xt)
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=tol, atol=tol)
    g = np.random.default_rng(2).standard_normal(yt.shape).astype(np_dtype)
    (y * pb.tensor(g)).sum().backward()
    yt.backward(torch.from_numpy(g))
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(module.weight.grad.numpy(), tmodule.weight.grad.numpy(),
                               rtol=tol, atol=tol)
    # The layer's own backprop (backend kernels, no graph) agrees.
    _, trace = module.traced_forward(pb.tensor(x0))
    gx, grads = module.backprop(trace, pb.tensor(g))
    np.testing.assert_allclose(gx.numpy(), xt.grad.numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(grads["weight"].numpy(), tmodule.weight.grad.numpy(), rtol=tol,
                               atol=tol)
    if module.bias is not None:
        np.testing.assert_allclose(grads["bias"].numpy(), tmodule.bias.grad.numpy(), rtol=tol,
                                   atol=tol)


def test_grouped_conv2d_init_bound_uses_the_channels_per_group() -> None:
    pb.manual_seed(0)
    conv = nn.Conv2d(8, 16, 3, groups=4)
    assert conv.weight.shape == (16, 2, 3, 3)
    bound = 1 / np.sqrt(2 * 9)
    w = conv.weight.numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert np.abs(conv.bias.numpy()).max() <= bound


def test_conv2d_repr_names_dilation_and_groups() -> None:
    text = repr(nn.Conv2d(4, 6, 3, dilation=2, groups=2))
    assert "4, 6, kernel_size=(3, 3)" in text and "dilation=(2, 2)" in text
    assert "groups=2" in text
    assert "dilation" not in repr(nn.Conv2d(4, 6, 3))


@pytest.mark.parametrize(("kwargs", "text"), [
    (dict(groups=3), "Conv2d: groups 3 must divide both in_channels 4 and out_channels 6"),
    (dict(groups=0), "Conv2d: groups must be a positive int, not 0"),
    (dict(dilation=(1, 2, 3)), "Conv2d: dilation must be an int or a pair of ints, not (1, 2, 3)"),
])
def test_conv2d_rejects_bad_arguments(kwargs: dict, text: str) -> None:
    with pytest.raises(ValueError) as info:
        nn.Conv2d(4, 6, 3, **kwargs)
    assert text in str(info.value)
