"""take and take_along_axis beyond the op table: the errors they raise, the scatter-add
kernel against NumPy's np.add.at (and the forward-op defaults against both), and
plans that read new indices at each call."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback.backend import CpuBackend
from pullback.backend.gather import GatherOps
from pullback.ops import take_along_axis_scatter_add, take_scatter_add

rng = np.random.default_rng(3)


def test_indices_out_of_range_name_the_op_shapes_dtypes_and_range() -> None:
    x = pb.zeros(5, 3)
    with pytest.raises(pb.KernelError, match=r"^take: \(5, 3\) and \(2,\): indices must lie in "
                       r"\[-5, 5\) along axis 0 \(of size 5\), got values from -6 to 1 "
                       r"\(dtypes float32 and int64\)"):
        pb.take(x, np.array([1, -6]))
    with pytest.raises(IndexError, match=r"^take_along_axis: \(5, 3\) and \(5, 1\): indices "
                       r"must lie in \[-3, 3\) along axis 1 .* from 0 to 3 \(dtypes float32 "
                       r"and int32\)"):
        pb.take_along_axis(x, np.array([[0], [3], [1], [2], [0]], np.int32), 1)


@pytest.mark.parametrize("call, match", [
    (lambda x: pb.take(x, np.array([0.0, 1.0])), r"^take: .*indices must be an integer"),
    (lambda x: pb.take(x, np.array([True])), r"^take: .*indices must be an integer"),
    (lambda x: pb.take(x, [0], axis=2), r"^take: .*axis 2 is out of range for 2 dimensions"),
    (lambda x: pb.take(x, [0], axis=1.0), r"^take: .*axis must be an int"),
    (lambda x: pb.take(x.sum(), [0]), r"^take: \(\): cannot gather from a 0-d tensor"),
    (lambda x: pb.take_along_axis(x, np.array([0, 1]), 1),
     r"^take_along_axis: \(4, 3\) and \(2,\): indices must have x's 2 dimensions"),
    (lambda x: pb.take_along_axis(x, np.zeros((2, 1), np.int64), 1),
     r"^take_along_axis: .*sizes 4 and 2 on axis 0 do not broadcast"),
])
def test_bad_indices_and_axes_are_refused(call, match) -> None:
    with pytest.raises(pb.KernelError, match=match):
        call(pb.zeros(4, 3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scatter_adds_accumulate_as_np_add_at(dtype) -> None:
    backend = CpuBackend()
    values = rng.standard_normal((2, 3, 2, 4)).astype(dtype)
    rows = np.array([[0, -1], [4, 0], [0, 0]])  # repeated and negative
    expected = np.zeros((2, 5, 4), dtype)
    np.add.at(expected, (slice(None), rows), values)
    got = backend.take_scatter_add(values, rows, 1, 5)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # The defaults in forward ops (getitem, scatter_add) compute the same.
    np.testing.assert_allclose(GatherOps.take_scatter_add(backend, values, rows, 1, 5), expected,
                               rtol=1e-6)
    # One index per element, broadcast over axis 0 of (2, 3, 4) values.
    along = np.array([[[1, -2, 0, 0], [0, 0, 0, 1], [1, 1, 1, 1]]])
    flat = values[:, :, 0]
    expected = np.zeros((2, 2, 4), dtype)
    np.add.at(expected, (np.arange(2)[:, None, None], np.broadcast_to(along % 2, flat.shape),
                         np.arange(4)), flat)
    for scatter in (backend.take_along_axis_scatter_add,
                    lambda *a: GatherOps.take_along_axis_scatter_add(backend, *a)):
        np.testing.assert_allclose(scatter(flat, along, 1, 2), expected, rtol=1e-6)


def test_integer_and_empty_scatters_and_the_forward_defaults_agree_with_numpy() -> None:
    backend = CpuBackend()
    ints = np.arange(6).reshape(3, 2)
    np.testing.assert_array_equal(backend.take_scatter_add(ints, np.array([1, 1, 0]), 0, 2),
                                  [[4, 5], [2, 4]])
    empty = backend.take_scatter_add(np.zeros((0, 3), np.float32), np.zeros(0, np.int64), 0, 4)
    np.testing.assert_array_equal(empty, np.zeros((4, 3), np.float32))
    x = rng.standard_normal((3, 4))
    idx = np.array([[2], [-1], [0]])
    np.testing.assert_array_equal(GatherOps.take(backend, x, idx, 1), np.take(x, idx, 1))
    np.testing.assert_array_equal(GatherOps.take_along_axis(backend, x[:1], idx, 1),
                                  np.take_along_axis(x[:1], idx, 1))


def test_scatter_add_primitives_are_the_gathers_transposes() -> None:
    # <take(x), v> == <x, take_scatter_add(v)>, and the same for take_along_axis.
    x, v = rng.standard_normal((4, 3)), rng.standard_normal((2, 2, 3))
    idx = np.array([[3, 0], [3, -4]])
    lhs = float(np.sum(pb.take(x, idx).numpy() * v))
    assert np.isclose(lhs, float(np.sum(x * take_scatter_add(v, idx, 0, 4).numpy())))
    along, w = np.array([[2], [0], [2], [1]]), rng.standard_normal((4, 1))
    lhs = float(np.sum(pb.take_along_axis(x, along, 1).numpy() * w))
    assert np.isclose(lhs, float(np.sum(x * take_along_axis_scatter_add(w, along, 1, 3).numpy())))


def test_a_training_plan_reads_new_indices_at_each_call() -> None:
    table = pb.tensor(rng.standard_normal((6, 3)), requires_grad=True)

    def loss(ids, picks):
        rows = pb.take(table, ids)  # (2, 3, 3)
        return (pb.take_along_axis(rows, picks, 2) ** 2).sum()

    ids0, picks0 = np.array([[0, 1, 1], [2, 3, 0]]), np.zeros((2, 3, 1), np.int64)
    step = pb.compile(loss, ids0, picks0, mode=pb.LoweringMode.TRAINING)
    step(ids0, picks0)
    table.grad = None
    ids, picks = np.array([[5, 5, 4], [0, 5, 1]]), np.array([[[2], [1], [2]], [[0], [2], [1]]])
    value = step(ids, picks)
    got = table.grad.numpy().copy()
    table.grad = None
    eager = loss(pb.tensor(ids), pb.tensor(picks))
    eager.backward()
    np.testing.assert_allclose(value.item(), eager.item(), rtol=1e-12)
    np.testing.assert_allclose(got, table.grad.numpy(), rtol=1e-12)
    assert got[5].any() and not got[2].any()  # rows read by the new ids only
    with pytest.raises(pb.KernelError, match=r"^take: .*got values from 0 to 6"):
        step(np.array([[6, 0, 0], [0, 0, 0]]), picks)
