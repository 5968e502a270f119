"""A tensor's data is always an `np.ndarray`, never a NumPy scalar: NumPy's ufuncs and
operators collapse 0-d results to scalars, which `np.asarray(t)` then refuses ("object
__array__ method not producing an array"). Checked for every row of the op table, on its
own shapes and on 0-d inputs, through every path that makes a tensor: the forward, a
gradient accumulated twice, `pb.grad`, `pb.vjp`, `pb.jvp`, and both kinds of plan."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pytest
from op_table import ROWS, OpSpec

import pullback as pb

F64 = np.dtype(np.float64)


def _assert_arrays(what: str, tensors: Iterable) -> None:
    for i, t in enumerate(tensors):
        assert isinstance(t, pb.Tensor), f"{what} [{i}]: {type(t).__name__}"
        assert type(t._data) is np.ndarray, f"{what} [{i}]: holds a {type(t._data).__name__}"
        assert type(np.asarray(t)) is np.ndarray and type(t.numpy()) is np.ndarray, what


def _loss(row: OpSpec, *xs: pb.Tensor) -> pb.Tensor:
    return pb.sum(row.pb_fn(*xs) * 0.5)


def _zero_dim_inputs(row: OpSpec) -> list[np.ndarray] | None:
    """The row's first input as a 0-d array, where the op takes one."""
    arrays = [np.asarray(a.reshape(-1)[0]) if i == 0 else a
              for i, a in enumerate(row.inputs(F64))]
    try:
        row.pb_fn(*(pb.tensor(a) for a in arrays))
    except Exception:  # the op refuses a 0-d operand: nothing to check
        return None
    return arrays


def _check_every_path(row: OpSpec, arrays: list[np.ndarray]) -> None:
    xs = [pb.tensor(a) for a in arrays]
    argnums = tuple(range(len(xs)))
    _assert_arrays("forward", [row.pb_fn(*xs)])
    leaves = [pb.tensor(a, requires_grad=True) for a in arrays]
    _loss(row, *leaves).backward()
    _loss(row, *leaves).backward()  # accumulates into .grad
    _assert_arrays("backward twice", [x.grad for x in leaves])
    leaves = [pb.tensor(a, requires_grad=True) for a in arrays]
    _loss(row, *leaves).backward(create_graph=True)
    _loss(row, *leaves).backward()
    _assert_arrays("backward(create_graph=True), then backward", [x.grad for x in leaves])
    _assert_arrays("pb.grad", pb.grad(lambda *ys: _loss(row, *ys), argnums=argnums)(*xs))
    out, vjp_fn = pb.vjp(row.pb_fn, *xs)
    _assert_arrays("pb.vjp", vjp_fn(np.ones(out.shape)))
    _assert_arrays("pb.jvp", pb.jvp(row.pb_fn, tuple(xs), tuple(pb.ones_like(x) for x in xs)))
    _assert_arrays("INFERENCE plan", [pb.compile(row.pb_fn, *xs)(*xs)])
    params = [pb.tensor(a, requires_grad=True) for a in arrays]
    step = pb.compile(lambda: _loss(row, *params), mode=pb.LoweringMode.TRAINING)
    _assert_arrays("TRAINING plan", [step(), step()])
    _assert_arrays("TRAINING plan's .grad after two calls", [p.grad for p in params])


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_every_path_gives_tensors_holding_arrays(row: OpSpec) -> None:
    _check_every_path(row, row.inputs(F64))
    zero_dim = _zero_dim_inputs(row)
    if zero_dim is not None:
        _check_every_path(row, zero_dim)
