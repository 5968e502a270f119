"""Sample inputs for every primitive: the one table `pullback check` runs.

A row names how to apply the primitive (through its public function) and how
to draw its inputs: shapes that broadcast for binary ops, domains where the op
is smooth (log on positives, no ties for max, clip away from its bounds).
Samplers draw float64; the runner casts floating inputs to the dtype it checks.
Adding a primitive means adding its row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import ops

Sampler = Callable[[np.random.Generator], np.ndarray]


@dataclass(frozen=True)
class Spec:
    """How to check one primitive.

    `fn` applies it to the sampled inputs (it may return a tuple, to cover
    several parameter settings at once); `sample` draws the inputs; `order` is
    the highest derivative to check (2: the derivative of the vjp too);
    `reference`, for primitives without a gradient, is NumPy's forward.
    """

    fn: Callable[..., Any]
    sample: Callable[[np.random.Generator], tuple[np.ndarray, ...]]
    order: int = 2
    reference: Callable[..., Any] | None = None


def inputs(*samplers: Sampler) -> Callable[[np.random.Generator], tuple[np.ndarray, ...]]:
    return lambda rng: tuple(s(rng) for s in samplers)


def normal(*shape: int) -> Sampler:
    return lambda rng: rng.standard_normal(shape)


def labels(classes: int, *shape: int) -> Sampler:
    """Integer class labels: an operand that is never differentiated."""
    return lambda rng: rng.integers(0, classes, shape)


def positive(*shape: int) -> Sampler:
    return lambda rng: rng.uniform(0.5, 2.0, shape)


def nonzero(*shape: int) -> Sampler:
    """Away from 0, where abs, relu and sign have kinks."""
    return lambda rng: rng.choice((-1.0, 1.0), shape) * rng.uniform(0.2, 1.5, shape)


def distinct(*shape: int) -> Sampler:
    """No two values within 0.02 of each other: no ties for max and max_pool2d."""
    size = int(np.prod(shape))
    return lambda rng: (rng.permutation(size).reshape(shape) - size / 2) * 0.05


def constant(value: Any) -> Sampler:
    return lambda rng: np.asarray(value)


def _separated(shape_a: tuple, shape_b: tuple) -> Callable[[np.random.Generator], tuple]:
    """a and b at least 0.2 apart everywhere: maximum and minimum have no ties."""

    def sample(rng: np.random.Generator) -> tuple:
        b = rng.standard_normal(shape_b)
        gap = nonzero(*np.broadcast_shapes(shape_a, shape_b))(rng)
        return b + gap, b

    return sample


def _clip_sample(rng: np.random.Generator) -> tuple:
    """Inside and outside [-0.5, 0.5], and at least 0.1 from either bound."""
    x = rng.uniform(-1.5, 1.5, (3, 5))
    near = np.abs(np.abs(x) - 0.5) < 0.1
    return (np.where(near, x * 0.5, x),)


def _fold_sample(rng: np.random.Generator) -> tuple:
    return (rng.standard_normal((1, 2, 2, 3, 3, 3)),)


_INDEX = (np.array([0, 2, 2]), slice(1, 4))  # a repeated row: scatter_add must accumulate
_MASK = np.array([[True], [False], [True]])
_CONV = {"stride": (2, 1), "padding": (1, 0)}
_WINDOW = {"kernel": (2, 3), "stride": (2, 1), "padding": (1, 0)}


def _conv_variants(x: Any, w: Any, b: Any) -> tuple:
    """conv2d plain, dilated, grouped and depthwise: w (2, 4, 3, 2) reshaped to each
    grouping's (O, C / groups, kh, kw)."""
    return (
        ops.conv2d(x, w, b, **_CONV),
        ops.conv2d(x, w, b, padding=(2, 1), dilation=(2, 3)),
        ops.conv2d(x, ops.reshape(w, (4, 2, 3, 2)), stride=(1, 2), groups=2),
        ops.conv2d(x, ops.reshape(w, (8, 1, 3, 2)), padding=1, dilation=(1, 2), groups=4),
    )


# Comparisons see equal values too: distinct entries, some of them repeated in b.
_compared = inputs(distinct(3, 4), constant([0.0, 0.05, -0.1, 7.0]))


def _other_float(x: Any) -> Any:
    return np.float32 if x.dtype == np.float64 else np.float64


SPECS: dict[str, Spec] = {
    # binary arithmetic: both operands broadcast
    "add": Spec(ops.add, inputs(normal(2, 1, 4), normal(3, 1))),
    "sub": Spec(ops.sub, inputs(normal(2, 1, 4), normal(3, 1))),
    "mul": Spec(ops.mul, inputs(normal(2, 1, 4), normal(3, 1))),
    "div": Spec(ops.div, inputs(normal(2, 1, 4), nonzero(3, 1))),
    "pow": Spec(ops.pow, inputs(positive(2, 3), normal(3))),
    "maximum": Spec(ops.maximum, _separated((3, 4), (4,))),
    "minimum": Spec(ops.minimum, _separated((3, 4), (4,))),
    # comparisons: bool results, no gradient
    "less": Spec(ops.less, _compared, reference=np.less),
    "less_equal": Spec(ops.less_equal, _compared, reference=np.less_equal),
    "greater": Spec(ops.greater, _compared, reference=np.greater),
    "greater_equal": Spec(ops.greater_equal, _compared, reference=np.greater_equal),
    "equal": Spec(ops.equal, _compared, reference=np.equal),
    "not_equal": Spec(ops.not_equal, _compared, reference=np.not_equal),
    # unary
    "neg": Spec(ops.neg, inputs(normal(3, 4))),
    "sign": Spec(ops.sign, inputs(nonzero(3, 4)), reference=np.sign),
    # losses and sampling: labels and masks are operands without gradients
    "cross_entropy": Spec(ops.cross_entropy, inputs(normal(4, 5), labels(5, 4))),
    "one_hot": Spec(lambda y: ops.one_hot(y, 5, np.dtype(np.float64)), inputs(labels(5, 6)),
                    reference=lambda y: np.eye(5)[y]),
    "dropout_mask": Spec(lambda x: ops.dropout_mask(x, 0.0, np.random.default_rng),
                         inputs(normal(3, 4)), reference=np.ones_like),
    "exp": Spec(ops.exp, inputs(normal(3, 4))),
    "log": Spec(ops.log, inputs(positive(3, 4))),
    "sqrt": Spec(ops.sqrt, inputs(positive(3, 4))),
    "abs": Spec(ops.abs, inputs(nonzero(3, 4))),
    "relu": Spec(ops.relu, inputs(nonzero(3, 4))),
    "sigmoid": Spec(ops.sigmoid, inputs(normal(3, 4))),
    "tanh": Spec(ops.tanh, inputs(normal(3, 4))),
    "silu": Spec(ops.silu, inputs(normal(3, 4))),
    "softplus": Spec(ops.softplus, inputs(normal(3, 4))),
    "erf": Spec(ops.erf, inputs(normal(3, 4))),
    "gelu": Spec(lambda x: (ops.gelu(x), ops.gelu(x, approximate="tanh")), inputs(normal(3, 4))),
    # selection and casts; where's condition is a bool input, held fixed
    "where": Spec(ops.where, inputs(constant(_MASK), normal(3, 4), normal(4))),
    "clip": Spec(lambda x: (ops.clip(x, -0.5, 0.5), ops.clip(x, lo=-0.5)), _clip_sample),
    "astype": Spec(lambda x: ops.astype(x, _other_float(x)), inputs(normal(3, 4))),
    # reductions and row-wise normalizations
    "sum": Spec(lambda x: (ops.sum(x, axis=1), ops.sum(x, axis=(0, 2), keepdims=True),
                           ops.sum(x)), inputs(normal(2, 3, 4))),
    "max": Spec(lambda x: (ops.max(x, axis=2), ops.max(x, axis=(0, 1), keepdims=True)),
                inputs(distinct(2, 3, 4))),
    "softmax": Spec(lambda x: (ops.softmax(x), ops.softmax(x, axis=0)), inputs(normal(3, 5))),
    "log_softmax": Spec(lambda x: (ops.log_softmax(x), ops.log_softmax(x, axis=0)),
                        inputs(normal(3, 5))),
    "layer_norm": Spec(lambda x, w, b: (ops.layer_norm(x, w, b), ops.layer_norm(x, w, b, 0.1)),
                       inputs(normal(2, 3, 5), normal(5), normal(5))),
    # shapes
    "reshape": Spec(lambda x: ops.reshape(x, (6, 4)), inputs(normal(2, 3, 4))),
    "transpose": Spec(lambda x: ops.transpose(x, (2, 0, 1)), inputs(normal(2, 3, 4))),
    "broadcast_to": Spec(lambda x: ops.broadcast_to(x, (2, 3, 4)), inputs(normal(3, 1))),
    "sum_to_shape": Spec(lambda x: ops.sum_to_shape(x, (3, 1)), inputs(normal(2, 3, 4))),
    "getitem": Spec(lambda x: (ops.getitem(x, 1), ops.getitem(x, _INDEX),
                               ops.getitem(x, (Ellipsis, slice(None, None, 2)))),
                    inputs(normal(4, 5))),
    "scatter_add": Spec(lambda v: ops.scatter_add(v, _INDEX, (4, 5)), inputs(normal(3, 3))),
    "concatenate": Spec(lambda a, b, c: ops.concatenate((a, b, c), axis=1),
                        inputs(normal(2, 3), normal(2, 1), normal(2, 2))),
    "pad2d": Spec(lambda x: ops.pad2d(x, (1, 2)), inputs(normal(1, 2, 3, 3))),
    # linear algebra, convolution, pooling
    "matmul": Spec(lambda a, b, v: (ops.matmul(a, b), ops.matmul(a, v), ops.matmul(v, b)),
                   inputs(normal(2, 3, 4), normal(4, 5), normal(4))),
    "unfold2d": Spec(lambda x: (ops.unfold2d(x, **_WINDOW),
                                ops.unfold2d(x, **_WINDOW, dilation=(2, 1))),
                     inputs(normal(1, 2, 5, 5))),
    "fold2d": Spec(lambda c: (ops.fold2d(c, (1, 2, 5, 5), **_WINDOW),
                              ops.fold2d(c, (1, 2, 5, 5), **_WINDOW, dilation=(2, 1))),
                   _fold_sample),
    "conv2d": Spec(_conv_variants, inputs(normal(2, 4, 6, 5), normal(2, 4, 3, 2), normal(2))),
    "max_pool2d": Spec(lambda x: (ops.max_pool2d(x, 2), ops.max_pool2d(x, 3, 2, 1),
                                  ops.max_pool2d(x, 2, 1, 1, dilation=(2, 3))),
                       inputs(distinct(1, 2, 5, 6))),
    "avg_pool2d": Spec(lambda x: (ops.avg_pool2d(x, 2), ops.avg_pool2d(x, 3, 2, 1)),
                       inputs(normal(1, 2, 5, 6))),
    # trigonometric, logsumexp and the running sum
    "sin": Spec(ops.sin, inputs(normal(3, 4))),
    "cos": Spec(ops.cos, inputs(normal(3, 4))),
    "logsumexp": Spec(lambda x: (ops.logsumexp(x), ops.logsumexp(x, axis=1),
                                 ops.logsumexp(x, axis=(0, 2), keepdims=True)),
                      inputs(normal(2, 3, 4))),
    "cumsum": Spec(lambda x: (ops.cumsum(x, 1), ops.cumsum(x, -1)), inputs(normal(2, 3, 4))),
}
