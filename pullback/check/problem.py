"""What a gradient check works on: the function of its floating inputs, its
Jacobians by differences, vjp and jvp, and the findings it reports.

Non-floating inputs are held fixed; only floating outputs are compared.
Every gradient and tangent is checked for its shape and dtype on the way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ad import ForwardModeError
from ..tensor import Tensor, jvp, no_grad, tensor, vjp

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from ..ops.hints import TensorLike

# Central differences lose about this many ulps of each output to rounding.
ROUNDING_ULPS = 8.0


class GradcheckError(AssertionError):
    """A derivative disagrees with central differences (or forward with reverse mode),
    or a gradient has the wrong shape or dtype."""


@dataclass(frozen=True)
class Tolerance:
    eps: float
    atol: float
    rtol: float


@dataclass(frozen=True)
class Finding:
    """One comparison: what was compared, where, both values, and how far apart."""

    what: str
    where: str
    analytical: float
    numerical: float
    error: float
    allowed: float
    labels: tuple[str, str] = ("analytical", "numerical")
    against: str = "central differences"

    @property
    def ratio(self) -> float:
        if self.allowed > 0:
            return self.error / self.allowed
        return 0.0 if self.error == 0 else float("inf")

    @property
    def passed(self) -> bool:
        return bool(self.error <= self.allowed)  # a NaN fails

    def message(self) -> str:
        first, second = self.labels
        return (f"gradcheck: {self.what} and {self.against} disagree at {self.where}: "
                f"{first} {self.analytical:.8g}, {second} {self.numerical:.8g} "
                f"(difference {self.error:.3g}, tolerance {self.allowed:.3g})")


def worst(found: Sequence[Finding | None]) -> Finding | None:
    """The finding furthest beyond (or least within) its tolerance; NaNs count worst."""
    real = [f for f in found if f is not None]
    if not real:
        return None
    return max(real, key=lambda f: float("inf") if np.isnan(f.error) else f.ratio)


def _as_argument(x: Any) -> Any:
    if isinstance(x, Tensor):
        return x.detach()
    if isinstance(x, (np.ndarray, np.generic)):  # before float: np.float64 is a float
        array = np.asarray(x)
        return tensor(array, dtype=array.dtype)
    return tensor(x) if isinstance(x, float) else x


def _index(flat: int, shape: tuple) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


class Problem:
    """`f` as a function of its floating inputs (`primals`), the others held fixed."""

    def __init__(self, f: Callable[..., Tensor | Sequence[Tensor]],
                 inputs: TensorLike | Sequence[object], numbers: list[int] | None = None):
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        self.f = f
        self.args = [_as_argument(x) for x in inputs]
        self.wrt = [i for i, a in enumerate(self.args)
                    if isinstance(a, Tensor) and a.dtype.kind == "f"]
        if not self.wrt:
            raise ValueError("gradcheck: no floating input to check; inputs are "
                             f"{[type(a).__name__ for a in self.args]}")
        self.numbers = numbers or self.wrt
        self.primals = [self.args[i] for i in self.wrt]
        with no_grad():
            result = self(*self.primals)
        self.single = isinstance(result, Tensor)
        outs: tuple = ()
        if self.single or isinstance(result, (tuple, list)):
            outs = (result,) if self.single else tuple(result)
        if not outs or not all(isinstance(o, Tensor) for o in outs):
            raise TypeError("gradcheck: the function must return a tensor or a tuple of "
                            f"tensors, not {type(result).__name__}")
        self.outputs = [(o.shape, o.dtype) for o in outs]
        self.float_outs = [k for k, o in enumerate(outs) if o.dtype.kind == "f"]
        if not self.float_outs:
            raise ValueError("gradcheck: the function has no floating output to check")
        dtypes = {str(p.dtype) for p in self.primals}
        dtypes |= {str(self.outputs[k][1]) for k in self.float_outs}
        self.lowest_precision = "float32" if dtypes - {"float64"} else "float64"
        self.in_sizes = [p.size for p in self.primals]
        self.out_sizes = [int(np.prod(self.outputs[k][0])) for k in self.float_outs]
        self.jacobian_size = sum(self.in_sizes) * sum(self.out_sizes)

    def __call__(self, *xs: Tensor) -> Any:  # what `f` returns (checked at construction)
        args = list(self.args)
        for i, x in zip(self.wrt, xs, strict=True):
            args[i] = x
        return self.f(*args)

    # -- values --------------------------------------------------------------------------

    def floating(self, result: Any) -> Any:
        """The floating entries of a result structured like the function's."""
        if self.single:
            return result
        return tuple(result[k] for k in self.float_outs)

    def evaluate(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        with no_grad():
            result = self(*[tensor(np.asarray(a, dtype=p.dtype), dtype=p.dtype)
                            for a, p in zip(arrays, self.primals, strict=True)])
        outs = (result,) if self.single else tuple(result)
        return [np.array(outs[k].numpy(), dtype=np.float64) for k in self.float_outs]

    def random_inputs(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.standard_normal(p.shape) for p in self.primals]

    def random_outputs(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.standard_normal(self.outputs[k][0]) for k in self.float_outs]

    def perturbed(self, v: list[np.ndarray], eps: float) -> tuple[list, list, list]:
        """Inputs moved by +-eps*v in their own dtype, and the steps actually taken."""
        xs = [p.numpy().astype(np.float64) for p in self.primals]
        dtypes = [p.dtype for p in self.primals]
        plus = [np.asarray(x + eps * d, dtype=t) for x, d, t in zip(xs, v, dtypes, strict=True)]
        minus = [np.asarray(x - eps * d, dtype=t) for x, d, t in zip(xs, v, dtypes, strict=True)]
        steps = [a - b.astype(np.float64) for a, b in zip(plus, minus, strict=True)]
        return plus, minus, steps

    def rounding(self, u: list[np.ndarray], plus: list[np.ndarray],
                 minus: list[np.ndarray]) -> list[np.ndarray]:
        """Per output element, how much rounding can move `u * (plus - minus)`."""
        parts = zip(self.float_outs, u, plus, minus, strict=True)
        return [ROUNDING_ULPS * float(np.finfo(self.outputs[k][1]).eps) * np.abs(c)
                * (np.abs(p) + np.abs(m)) for k, c, p, m in parts]

    # -- derivatives, with their shapes and dtypes checked --------------------------------

    def cotangent_arg(self, u: list[np.ndarray]) -> NDArray[Any] | tuple[NDArray[Any], ...]:
        cts = [np.zeros(shape, dtype) for shape, dtype in self.outputs]
        for k, c in zip(self.float_outs, u, strict=True):
            cts[k] = np.asarray(c, dtype=self.outputs[k][1])
        return cts[0] if self.single else tuple(cts)

    def pullback(self, vjp_fn: Callable[[Any], tuple[Tensor, ...]], u: list[np.ndarray]
                 ) -> list[np.ndarray]:
        grads = vjp_fn(self.cotangent_arg(u))
        if len(grads) != len(self.primals):
            raise GradcheckError(f"gradcheck: the vjp returned {len(grads)} gradients for "
                                 f"{len(self.primals)} floating inputs")
        for n, g, p in zip(self.numbers, grads, self.primals, strict=True):
            if tuple(g.shape) != tuple(p.shape) or g.dtype != p.dtype:
                raise GradcheckError(
                    f"gradcheck: the gradient for input {n} has shape {tuple(g.shape)} and "
                    f"dtype {g.dtype}, but input {n} has shape {p.shape} and dtype {p.dtype}")
        return [np.array(g.numpy(), dtype=np.float64) for g in grads]

    @property
    def has_forward_mode(self) -> bool:
        """False when an op on the way supports reverse mode only (a custom op without
        jvp): then only reverse mode is checked."""
        known = self.__dict__.get("_forward_mode")
        if known is None:
            try:
                self.pushforward([np.zeros(p.shape) for p in self.primals])
                known = True
            except ForwardModeError:
                known = False
            self.__dict__["_forward_mode"] = known
        return known

    def pushforward(self, t: list[np.ndarray]) -> list[np.ndarray]:
        """The jvp's output tangents for input tangents `t` (pb.jvp, the JVP rules)."""
        tangents = [np.asarray(x, dtype=p.dtype) for x, p in zip(t, self.primals, strict=True)]
        _, result = jvp(self, self.primals, tangents)
        outs = (result,) if self.single else tuple(result)
        pushed = []
        for k in self.float_outs:
            shape, dtype = self.outputs[k]
            o = outs[k]
            if tuple(o.shape) != tuple(shape) or o.dtype != dtype:
                raise GradcheckError(
                    f"gradcheck: the jvp's tangent for output {k} has shape {tuple(o.shape)} "
                    f"and dtype {o.dtype}, but output {k} has shape {shape} and dtype {dtype}")
            pushed.append(np.array(np.asarray(o), dtype=np.float64))
        return pushed

    # -- whole Jacobians, (outputs flattened and stacked) x (one input's elements) -----------

    def numerical_jacobian(self, eps: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
        xs = [p.numpy() for p in self.primals]
        columns, noises = [], []
        for i, x in enumerate(xs):
            jac = np.zeros((sum(self.out_sizes), x.size))
            noise = np.zeros_like(jac)
            for j in range(x.size):
                v = [np.zeros(y.shape) for y in xs]
                v[i].flat[j] = 1.0
                plus, minus, steps = self.perturbed(v, eps)
                step = float(steps[i].flat[j])
                out_plus, out_minus = self.evaluate(plus), self.evaluate(minus)
                pairs = zip(out_plus, out_minus, strict=True)
                jac[:, j] = np.concatenate([(a - b).ravel() for a, b in pairs]) / step
                ones = [np.ones(o.shape) for o in out_plus]
                rounding = self.rounding(ones, out_plus, out_minus)
                noise[:, j] = np.concatenate([r.ravel() for r in rounding]) / abs(step)
            columns.append(jac)
            noises.append(noise)
        return columns, noises

    def reverse_jacobian(self) -> list[np.ndarray]:
        _, vjp_fn = vjp(self, *self.primals)
        rows = [np.zeros((sum(self.out_sizes), n)) for n in self.in_sizes]
        for r, (o, k) in enumerate(self._output_elements()):
            u = [np.zeros(self.outputs[m][0]) for m in self.float_outs]
            u[o].flat[k] = 1.0
            for jac, g in zip(rows, self.pullback(vjp_fn, u), strict=True):
                jac[r] = g.ravel()
        return rows

    def forward_jacobian(self) -> list[np.ndarray]:
        cols = []
        for i, n in enumerate(self.in_sizes):
            jac = np.zeros((sum(self.out_sizes), n))
            for j in range(n):
                t = [np.zeros(p.shape) for p in self.primals]
                t[i].flat[j] = 1.0
                jac[:, j] = np.concatenate([o.ravel() for o in self.pushforward(t)])
            cols.append(jac)
        return cols

    def _output_elements(self) -> list[tuple[int, int]]:
        return [(o, k) for o, size in enumerate(self.out_sizes) for k in range(size)]

    def describe(self, i: int, j: int, row: int) -> str:
        """Name input `i`'s element `j` and the output element of Jacobian row `row`."""
        p = self.primals[i]
        o, k = self._output_elements()[row]
        index, shape = self.float_outs[o], self.outputs[self.float_outs[o]][0]
        out = "output" if self.single else f"output {index}"
        return (f"input {self.numbers[i]} (shape {p.shape}, {p.dtype}) element "
                f"{_index(j, p.shape)}, {out} element {_index(k, shape)}")
