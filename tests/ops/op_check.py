"""The checkers every table row goes through: pullback against a float64 PyTorch oracle.

PyTorch always computes in float64 on the very inputs pullback saw (float32 inputs
upcast exactly), so a float32 tolerance measures pullback's own rounding only.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from op_table import OpSpec, rng_for

import pullback as pb

DTYPES = [pytest.param(np.dtype(np.float32), id="f32"),
          pytest.param(np.dtype(np.float64), id="f64")]

# Relative tolerances; the absolute floor is the same times the largest expected magnitude.
TOLERANCE = {
    (np.dtype(np.float64), False): 1e-10,
    (np.dtype(np.float64), True): 1e-10,
    (np.dtype(np.float32), False): 1e-5,
    (np.dtype(np.float32), True): 1e-4,
}


def tolerance(row: OpSpec, dtype: np.dtype, order: int = 1) -> float:
    tol = TOLERANCE[np.dtype(dtype), row.sums]
    # A second derivative multiplies in more rounded intermediates.
    return tol * 10 if order == 2 and np.dtype(dtype) == np.float32 else tol


def assert_close(got: object, want: np.ndarray, dtype: np.dtype, tol: float, what: str) -> None:
    array = np.asarray(got)
    assert array.dtype == dtype, f"{what}: dtype {array.dtype}, expected {dtype}"
    assert array.shape == want.shape, f"{what}: shape {array.shape}, expected {want.shape}"
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(array.astype(np.float64), want, rtol=tol, atol=tol * scale,
                               err_msg=what)


def to_torch(arrays: Sequence[np.ndarray], requires_grad: bool = False) -> list[torch.Tensor]:
    return [torch.tensor(a.astype(np.float64), requires_grad=requires_grad) for a in arrays]


def to_pb(arrays: Sequence[np.ndarray], requires_grad: bool = False) -> list[pb.Tensor]:
    return [pb.tensor(a, requires_grad=requires_grad) for a in arrays]


def numpy64(x: torch.Tensor) -> np.ndarray:
    return x.detach().numpy(force=True).astype(np.float64)  # force: a ZeroTensor


def torch_value(row: OpSpec, arrays: Sequence[np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        return numpy64(row.torch_fn(*to_torch(arrays)))


def random_like(row: OpSpec, shape: tuple, dtype: np.dtype, salt: str) -> np.ndarray:
    return rng_for(row.name + salt).standard_normal(shape).astype(dtype)


def output_cotangent(row: OpSpec, arrays: Sequence[np.ndarray]) -> np.ndarray:
    return random_like(row, torch_value(row, arrays).shape, arrays[0].dtype, "/cotangent")


def torch_grads(row: OpSpec, arrays: Sequence[np.ndarray], g: np.ndarray) -> list[np.ndarray]:
    xs = to_torch(arrays, requires_grad=True)
    loss = (row.torch_fn(*xs) * torch.from_numpy(g.astype(np.float64))).sum()
    return [numpy64(v) for v in torch.autograd.grad(loss, xs, materialize_grads=True)]


def pb_grads_by_backward(row: OpSpec, arrays: Sequence[np.ndarray],
                         g: np.ndarray) -> list[pb.Tensor | None]:
    xs = to_pb(arrays, requires_grad=True)
    (row.pb_fn(*xs) * pb.tensor(g)).sum().backward()
    return [x.grad for x in xs]


def check_grads(row: OpSpec, grads: Sequence[pb.Tensor | None], arrays: Sequence[np.ndarray],
                want: Sequence[np.ndarray], tol: float) -> None:
    for i, (got, x, expected) in enumerate(zip(grads, arrays, want, strict=True)):
        assert got is not None, f"{row.name}: input {i} got no gradient"
        assert_close(got, expected, x.dtype, tol, f"{row.name}: gradient of input {i}")


def torch_second(row: OpSpec, arrays: Sequence[np.ndarray], g: np.ndarray,
                 hs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """d/dx of <grad_x <f(x), g>, h>, by PyTorch's double backward."""
    xs = to_torch(arrays, requires_grad=True)
    loss = (row.torch_fn(*xs) * torch.from_numpy(g.astype(np.float64))).sum()
    firsts = torch.autograd.grad(loss, xs, create_graph=True, materialize_grads=True)
    directions = [torch.from_numpy(h.astype(np.float64)) for h in hs]
    dot = functools.reduce(operator.add, [
        (d * h).sum() for d, h in zip(firsts, directions, strict=True)])
    if not dot.requires_grad:  # the first derivative is constant: a linear op
        return [np.zeros(a.shape) for a in arrays]
    return [numpy64(v) for v in torch.autograd.grad(dot, xs, materialize_grads=True)]


def pb_second(row: OpSpec, arrays: Sequence[np.ndarray], g: np.ndarray,
              hs: Sequence[np.ndarray]) -> tuple:
    argnums = tuple(range(len(arrays)))
    g_t, hs_t = pb.tensor(g), [pb.tensor(h) for h in hs]

    def loss(*ys: pb.Tensor) -> pb.Tensor:
        return (row.pb_fn(*ys) * g_t).sum()

    def first_along_h(*xs: pb.Tensor) -> pb.Tensor:
        firsts = pb.grad(loss, argnums=argnums)(*xs)
        return functools.reduce(operator.add,
                                [(d * h).sum() for d, h in zip(firsts, hs_t, strict=True)])

    return pb.grad(first_along_h, argnums=argnums)(*to_pb(arrays))
