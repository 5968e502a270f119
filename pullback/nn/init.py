"""`nn.init`: PyTorch's initializers, writing into a tensor in place and returning it.

Writes are not recorded (they run under `no_grad`), so they work on parameters
that require grad, which stay leaves. Samples come from pullback's global
generator (seeded by `pb.manual_seed`, saved by training checkpoints) unless a
`generator=` (a `np.random.Generator`) is given; they are drawn in float64 and
rounded to the tensor's dtype. Fans are computed as torch.nn.init's: for a weight
of shape (out, in, *kernel), fan_in = in * prod(kernel), fan_out = out * prod(kernel).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..ops.hints import Shape
from ..tensor import Tensor, no_grad
from ..tensor.creation import default_generator

__all__ = [
    "calculate_gain",
    "constant_",
    "kaiming_normal_",
    "kaiming_uniform_",
    "normal_",
    "ones_",
    "trunc_normal_",
    "uniform_",
    "xavier_normal_",
    "xavier_uniform_",
    "zeros_",
]

_LINEAR = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d", "sigmoid")
# Below this share of the normal's mass inside [a, b], drawing and rejecting is hopeless.
_MIN_MASS = 1e-4


def _shape(op: str, tensor: object) -> Shape:
    """The shape of the tensor to fill, or a TypeError naming the initializer."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"nn.init.{op}: expected a pullback Tensor, got {type(tensor).__name__}")
    if tensor.dtype.kind != "f":
        raise TypeError(f"nn.init.{op}: the tensor ({tensor.shape} {tensor.dtype}) is not "
                        "floating point")
    return tuple(tensor.shape)


def _write(tensor: Tensor, values: NDArray[Any] | float) -> Tensor:
    """`values` written into `tensor` without recording; returns `tensor`."""
    with no_grad():
        tensor.copy_(values)
    return tensor


def _rng(generator: np.random.Generator | None) -> np.random.Generator:
    if generator is None:
        return default_generator()
    if not isinstance(generator, np.random.Generator):
        raise TypeError(f"nn.init: generator must be a np.random.Generator or None, got "
                        f"{type(generator).__name__}")
    return generator


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity, as torch.nn.init.calculate_gain."""
    if nonlinearity in _LINEAR:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        if isinstance(slope, bool) or not isinstance(slope, (int, float)):
            raise ValueError(f"calculate_gain: negative_slope {param!r} is not a valid number")
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _fans(op: str, tensor: object) -> tuple[int, int]:
    shape = _shape(op, tensor)
    if len(shape) < 2:
        raise ValueError(f"nn.init.{op}: fan in and fan out need a tensor of 2 or more "
                         f"dimensions, got shape {shape}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _fan(op: str, tensor: object, mode: str) -> int:
    fan_in, fan_out = _fans(op, tensor)
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"nn.init.{op}: mode must be 'fan_in' or 'fan_out', not {mode!r}")
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0,
             generator: np.random.Generator | None = None) -> Tensor:
    """Samples of U(a, b)."""
    return _write(tensor, _rng(generator).uniform(a, b, _shape("uniform_", tensor)))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0,
            generator: np.random.Generator | None = None) -> Tensor:
    """Samples of N(mean, std**2)."""
    return _write(tensor, _rng(generator).normal(mean, std, _shape("normal_", tensor)))


def constant_(tensor: Tensor, val: float) -> Tensor:
    _shape("constant_", tensor)
    return _write(tensor, val)


def zeros_(tensor: Tensor) -> Tensor:
    _shape("zeros_", tensor)
    return _write(tensor, 0.0)


def ones_(tensor: Tensor) -> Tensor:
    _shape("ones_", tensor)
    return _write(tensor, 1.0)


def xavier_uniform_(tensor: Tensor, gain: float = 1.0,
                    generator: np.random.Generator | None = None) -> Tensor:
    """U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio)."""
    fan_in, fan_out = _fans("xavier_uniform_", tensor)
    bound = math.sqrt(3.0) * gain * math.sqrt(2.0 / (fan_in + fan_out))
    return _write(tensor,
                  _rng(generator).uniform(-bound, bound, _shape("xavier_uniform_", tensor)))


def xavier_normal_(tensor: Tensor, gain: float = 1.0,
                   generator: np.random.Generator | None = None) -> Tensor:
    """N(0, std**2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _fans("xavier_normal_", tensor)
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    return _write(tensor, _rng(generator).normal(0.0, std, _shape("xavier_normal_", tensor)))


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu",
                     generator: np.random.Generator | None = None) -> Tensor:
    """U(-bound, bound) with bound = gain * sqrt(3 / fan) (He et al.); `a` is the
    negative slope of leaky_relu."""
    if 0 in _shape("kaiming_uniform_", tensor):
        return tensor  # nothing to fill, as PyTorch
    fan = _fan("kaiming_uniform_", tensor, mode)
    bound = math.sqrt(3.0) * calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return _write(tensor,
                  _rng(generator).uniform(-bound, bound, _shape("kaiming_uniform_", tensor)))


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu",
                    generator: np.random.Generator | None = None) -> Tensor:
    """N(0, std**2) with std = gain / sqrt(fan)."""
    if 0 in _shape("kaiming_normal_", tensor):
        return tensor
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan("kaiming_normal_", tensor, mode))
    return _write(tensor, _rng(generator).normal(0.0, std, _shape("kaiming_normal_", tensor)))


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0,
                  b: float = 2.0, generator: np.random.Generator | None = None) -> Tensor:
    """Samples of N(mean, std**2) conditioned on [a, b] (bounds in the values' units,
    as PyTorch's), drawn by rejection: exact, refusing a range that holds less than
    1e-4 of the distribution's mass."""
    if not (std > 0 and a < b):
        raise ValueError(f"nn.init.trunc_normal_: need std > 0 and a < b, got std={std}, "
                         f"a={a}, b={b}")
    mass = _normal_cdf((b - mean) / std) - _normal_cdf((a - mean) / std)
    if mass < _MIN_MASS:
        raise ValueError(f"nn.init.trunc_normal_: [{a}, {b}] holds only {mass:.3g} of "
                         f"N({mean}, {std}**2); choose bounds nearer the mean")
    rng, shape = _rng(generator), _shape("trunc_normal_", tensor)
    out = np.empty(math.prod(shape))
    filled = 0
    while filled < out.size:
        # Enough draws that one round usually fills the rest.
        wanted = out.size - filled
        draws = rng.normal(mean, std, int(wanted / mass * 1.1) + 16)
        kept = draws[(draws >= a) & (draws <= b)][:wanted]
        out[filled:filled + kept.size] = kept
        filled += kept.size
    return _write(tensor, out.reshape(shape))
