"""Shared helpers for the optimizer tests: twin parameters in pullback and PyTorch,
random gradients fed identically to both, and per-dtype tolerances."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

import pullback as pb

SHAPES: tuple[tuple[int, ...], ...] = ((3, 4), (5,), ())
STEPS = 6

# f32 results differ from PyTorch's by rounding (PyTorch fuses multiply-adds).
TOLERANCE = {np.float32: {"rtol": 2e-5, "atol": 1e-6}, np.float64: {"rtol": 1e-12, "atol": 1e-14}}


def initial_values(dtype: type, seed: int = 0,
                   shapes: Sequence[tuple[int, ...]] = SHAPES) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.asarray(rng.standard_normal(shape), dtype=dtype) for shape in shapes]


def pb_params(values: Sequence[np.ndarray]) -> list[pb.Tensor]:
    return [pb.tensor(v.copy(), requires_grad=True) for v in values]


def torch_params(values: Sequence[np.ndarray]) -> list[torch.Tensor]:
    return [torch.tensor(v.copy(), requires_grad=True) for v in values]


def random_grads(values: Sequence[np.ndarray], steps: int = STEPS, seed: int = 1,
                 scale: float = 1.0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[np.asarray(scale * rng.standard_normal(v.shape), dtype=v.dtype) for v in values]
            for _ in range(steps)]


def run_pb(opt: Any, params: Sequence[pb.Tensor], grads: list[list[np.ndarray | None]]
           ) -> list[list[np.ndarray]]:
    """Step `opt` once per entry of `grads` (None: no gradient for that parameter that
    step); the parameters' values after each step."""
    history = []
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = None if g is None else pb.tensor(g)
        opt.step()
        history.append([p.numpy().copy() for p in params])
    return history


def run_torch(opt: torch.optim.Optimizer, params: Sequence[torch.Tensor],
              grads: list[list[np.ndarray | None]],
              before_step: Callable[[], None] | None = None,
              scheduler: Any = None) -> list[list[np.ndarray]]:
    history = []
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = None if g is None else torch.tensor(g)
        if before_step is not None:
            before_step()
        opt.step()
        if scheduler is not None:
            scheduler.step()
        history.append([p.detach().numpy().copy() for p in params])
    return history


def assert_histories_close(ours: list[list[np.ndarray]], theirs: list[list[np.ndarray]]) -> None:
    assert len(ours) == len(theirs)
    for step, (mine, ref) in enumerate(zip(ours, theirs)):
        for index, (a, b) in enumerate(zip(mine, ref)):
            assert a.dtype == b.dtype, f"step {step}, parameter {index}: {a.dtype} vs {b.dtype}"
            np.testing.assert_allclose(a, b, **TOLERANCE[a.dtype.type],
                                       err_msg=f"step {step}, parameter {index}")
