"""nn.init: statistics of each initializer on large tensors (fixed generators) against
the distributions torch.nn.init draws from, with torch's fans and gains; writes in
place, unrecorded, on parameters that stay leaves."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

import pullback as pb
from pullback import nn
from pullback.nn import init

SHAPES = [(300, 200), (64, 32, 3, 3), (120, 40, 9)]


def torch_fans(shape: tuple[int, ...]) -> tuple[int, int]:
    return torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))


def param(shape: tuple[int, ...], dtype: type = np.float32) -> pb.Tensor:
    return nn.Parameter(pb.zeros(*shape, dtype=dtype))


def filled(fill: Callable[..., pb.Tensor], shape: tuple[int, ...], **kwargs) -> np.ndarray:
    p = param(shape)
    out = fill(p, generator=np.random.default_rng(0), **kwargs)
    assert out is p
    return p.numpy().astype(np.float64)


def assert_uniform(values: np.ndarray, low: float, high: float) -> None:
    assert values.min() >= low and values.max() <= high
    width = high - low
    # Over 50k draws the extremes come within 0.1% of the bounds.
    assert values.min() < low + 1e-3 * width and values.max() > high - 1e-3 * width
    assert abs(values.mean() - (low + high) / 2) < 0.01 * width


def assert_normal(values: np.ndarray, mean: float, std: float) -> None:
    n = values.size
    assert abs(values.mean() - mean) < 5 * std / math.sqrt(n)
    assert abs(values.std() / std - 1) < 5 / math.sqrt(2 * n)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_xavier_and_kaiming_use_torch_fans(shape: tuple[int, ...]) -> None:
    fan_in, fan_out = torch_fans(shape)
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    assert_uniform(filled(init.xavier_uniform_, shape), -bound, bound)
    assert_uniform(filled(init.xavier_uniform_, shape, gain=2.0), -2 * bound, 2 * bound)
    assert_normal(filled(init.xavier_normal_, shape, gain=0.5), 0.0,
                  0.5 * math.sqrt(2.0 / (fan_in + fan_out)))
    # Default a=0 with leaky_relu: gain sqrt(2), as torch.nn.init.kaiming_uniform_.
    bound = math.sqrt(6.0 / fan_in)
    assert_uniform(filled(init.kaiming_uniform_, shape), -bound, bound)
    bound = torch.nn.init.calculate_gain("leaky_relu", math.sqrt(5)) * math.sqrt(3.0 / fan_in)
    assert_uniform(filled(init.kaiming_uniform_, shape, a=math.sqrt(5)), -bound, bound)
    assert_normal(filled(init.kaiming_normal_, shape, mode="fan_out", nonlinearity="relu"),
                  0.0, math.sqrt(2.0) / math.sqrt(fan_out))


def test_normal_uniform_and_constants() -> None:
    assert_normal(filled(init.normal_, (400, 250), mean=0.5, std=2.0), 0.5, 2.0)
    assert_uniform(filled(init.uniform_, (400, 250), a=-3.0, b=1.0), -3.0, 1.0)
    p = param((3, 2), np.float64)
    assert (init.constant_(p, 0.25).numpy() == 0.25).all()
    assert (init.ones_(p).numpy() == 1).all() and not init.zeros_(p).numpy().any()


def test_trunc_normal_is_the_truncated_distribution() -> None:
    mean, std, a, b = 0.5, 2.0, -1.0, 3.0
    values = filled(init.trunc_normal_, (400, 250), mean=mean, std=std, a=a, b=b)
    assert values.min() >= a and values.max() <= b

    def pdf(x: float) -> float:
        return math.exp(-x * x / 2) / math.sqrt(2 * math.pi)

    def cdf(x: float) -> float:
        return 0.5 * (1 + math.erf(x / math.sqrt(2)))

    alpha, beta = (a - mean) / std, (b - mean) / std
    z = cdf(beta) - cdf(alpha)
    shift = (pdf(alpha) - pdf(beta)) / z
    true_mean = mean + std * shift
    true_std = std * math.sqrt(1 + (alpha * pdf(alpha) - beta * pdf(beta)) / z - shift**2)
    assert_normal(values, true_mean, true_std)
    # torch's defaults: N(0, 1) cut at +-2.
    values = filled(init.trunc_normal_, (100, 100))
    assert values.min() >= -2 and values.max() <= 2 and values.max() > 1.99


@pytest.mark.parametrize(("name", "param_"), [
    ("linear", None), ("conv2d", None), ("sigmoid", None), ("tanh", None), ("relu", None),
    ("leaky_relu", None), ("leaky_relu", 0.2), ("selu", None)])
def test_calculate_gain_matches_torch(name: str, param_: float | None) -> None:
    assert init.calculate_gain(name, param_) == pytest.approx(
        torch.nn.init.calculate_gain(name, param_), rel=1e-15)


def test_init_writes_in_place_without_recording() -> None:
    layer = nn.Linear(5, 4)
    view = layer.weight.numpy()
    out = init.xavier_uniform_(layer.weight)  # grad mode on: still allowed, not recorded
    assert out is layer.weight and layer.weight.numpy() is view and view.any()
    assert layer.weight.requires_grad and layer.weight.is_leaf and layer.weight.grad is None
    layer(pb.ones(2, 5)).sum().backward()
    assert layer.weight.grad.shape == (4, 5)  # still the module's trainable leaf


def test_generators_and_the_global_seed_reproduce_draws() -> None:
    a, b = param((4, 3)), param((4, 3))
    init.normal_(a, generator=np.random.default_rng(5))
    init.normal_(b, generator=np.random.default_rng(5))
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    pb.manual_seed(11)
    init.kaiming_uniform_(a)
    pb.manual_seed(11)
    init.kaiming_uniform_(b)
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_init_refuses_what_it_cannot_fill() -> None:
    with pytest.raises(ValueError, match=r"xavier_uniform_: fan in and fan out need a tensor "
                                         r"of 2 or more dimensions, got shape \(5,\)"):
        init.xavier_uniform_(param((5,)))
    with pytest.raises(ValueError, match="mode must be 'fan_in' or 'fan_out'"):
        init.kaiming_normal_(param((3, 3)), mode="fan_avg")
    with pytest.raises(TypeError, match=r"normal_: the tensor .* is not floating point"):
        init.normal_(pb.zeros(3, dtype=np.int64))
    with pytest.raises(TypeError, match="uniform_: expected a pullback Tensor"):
        init.uniform_(np.zeros(3))
    with pytest.raises(ValueError, match=r"trunc_normal_: \[5.0, 6.0\] holds only"):
        init.trunc_normal_(param((3,)), a=5.0, b=6.0)
    with pytest.raises(ValueError, match="unsupported nonlinearity 'swish'"):
        init.calculate_gain("swish")
