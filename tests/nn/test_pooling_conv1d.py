"""AvgPool2d, AdaptiveAvgPool2d and Conv1d against PyTorch's (Conv1d from a loaded
PyTorch state dict): outputs, input and parameter gradients, and their errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback import nn

DTYPES = {"f32": (np.float32, torch.float32, 2e-5), "f64": (np.float64, torch.float64, 1e-11)}

# name: (pullback module, torch module, input shape)
CASES = {
    "avg_pool2d": (lambda d: nn.AvgPool2d(2), lambda: torch.nn.AvgPool2d(2), (2, 3, 4, 6)),
    "avg_pool2d_stride_padding": (lambda d: nn.AvgPool2d(3, stride=2, padding=1),
                                  lambda: torch.nn.AvgPool2d(3, stride=2, padding=1),
                                  (1, 2, 5, 6)),
    "adaptive_avg_pool2d_global": (lambda d: nn.AdaptiveAvgPool2d(1),
                                   lambda: torch.nn.AdaptiveAvgPool2d(1), (2, 3, 5, 7)),
    # Window sizes the other tests compile kernels for too: 2x2 (tiles), 1x5 (general).
    "adaptive_avg_pool2d_pair": (lambda d: nn.AdaptiveAvgPool2d((2, 3)),
                                 lambda: torch.nn.AdaptiveAvgPool2d((2, 3)), (2, 2, 4, 6)),
    "adaptive_avg_pool2d_none_keeps_height": (lambda d: nn.AdaptiveAvgPool2d((None, 1)),
                                              lambda: torch.nn.AdaptiveAvgPool2d((None, 1)),
                                              (2, 2, 3, 5)),
    "conv1d_stride_padding": (lambda d: nn.Conv1d(3, 4, 3, stride=2, padding=1, dtype=d),
                              lambda: torch.nn.Conv1d(3, 4, 3, stride=2, padding=1),
                              (2, 3, 9)),
    "conv1d_dilation_groups_no_bias": (
        lambda d: nn.Conv1d(4, 2, 2, bias=False, dilation=2, groups=2, dtype=d),
        lambda: torch.nn.Conv1d(4, 2, 2, bias=False, dilation=2, groups=2), (2, 4, 7)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_layer_matches_torch(case: str, dtype: str) -> None:
    np_dtype, torch_dtype, tol = DTYPES[dtype]
    make, make_torch, shape = CASES[case]
    twin = make_torch().to(torch_dtype)
    module = make(np_dtype)
    # A PyTorch state dict, through NumPy, loads unchanged (Conv1d's (O, I, K) weight).
    module.load_state_dict({k: v.numpy() for k, v in twin.state_dict().items()})
    rng = np.random.default_rng(4)
    x0 = rng.standard_normal(shape).astype(np_dtype)
    x, xt = pb.tensor(x0, requires_grad=True), torch.tensor(x0, requires_grad=True)
    y, yt = module(x), twin(xt)
    assert y.dtype == np_dtype
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=tol, atol=tol)
    g = rng.standard_normal(tuple(yt.shape)).astype(np_dtype)
    (y * pb.tensor(g)).sum().backward()
    (yt * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=tol, atol=tol)
    params = list(module.named_parameters())
    assert [n for n, _ in params] == [n for n, _ in twin.named_parameters()]
    for (name, p), tp in zip(params, twin.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=tol, atol=tol,
                                   err_msg=name)


def test_adaptive_avg_pool2d_refuses_uneven_windows() -> None:
    with pytest.raises(ValueError, match=r"AdaptiveAvgPool2d: output size \(2, 2\) from an "
                       r"input of height and width \(5, 4\): only output sizes that divide"):
        nn.AdaptiveAvgPool2d(2)(pb.zeros(1, 1, 5, 4))
    with pytest.raises(ValueError, match="output_size must be a positive int"):
        nn.AdaptiveAvgPool2d(0)


def test_conv1d_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match=r"Conv1d: expected a 3-D input \(N, C, L\)"):
        nn.Conv1d(2, 2, 3)(pb.zeros(2, 5))
    with pytest.raises(ValueError, match="Conv1d: kernel_size must be an int"):
        nn.Conv1d(2, 2, (3, 3))
    with pytest.raises(ValueError, match="Conv1d: groups 2 must divide"):
        nn.Conv1d(3, 2, 3, groups=2)
