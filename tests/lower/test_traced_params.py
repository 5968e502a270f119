"""Parameters computed from a plan's inputs (a `where` condition, an index array) are
read anew at every call, never baked in from the tracing example."""

from __future__ import annotations

import numpy as np
import pytest

import pullback as pb
from pullback.lower import LoweringError

TRAINING = pb.LoweringMode.TRAINING


def clamp_negative(x):
    return pb.where(x > 0, x, x * 0.0)


def test_where_condition_follows_the_inputs() -> None:
    plan = pb.compile(clamp_negative, np.ones(3))  # traced where every x > 0
    x = np.array([-1.0, 2.0, -3.0])
    np.testing.assert_array_equal(plan(x).numpy(), [0.0, 2.0, 0.0])
    np.testing.assert_array_equal(plan(-x).numpy(), [1.0, 0.0, 3.0])


def test_training_plan_differentiates_through_the_current_condition() -> None:
    w = pb.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)

    def loss(x):
        return pb.sum(pb.where(x > 0, x * w, w * 3.0))

    plan = pb.compile(loss, np.ones(3), mode=TRAINING)
    for x in (np.array([-1.0, 2.0, -3.0]), np.array([4.0, -5.0, 6.0])):
        w.grad = None
        got = plan(x).item()
        planned = w.grad.numpy().copy()
        w.grad = None
        eager = loss(pb.tensor(x))
        eager.backward()
        assert got == pytest.approx(eager.item())
        np.testing.assert_array_equal(planned, w.grad.numpy())


def test_integer_index_from_the_inputs_is_read_each_call() -> None:
    table = pb.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
    rows = np.arange(3)

    def picked(y):
        return pb.sum(table[rows, y] * pb.tensor(np.array([1.0, 10.0, 100.0])))

    plan = pb.compile(picked, np.array([0, 1, 2]), mode=TRAINING)
    y = np.array([3, 3, 0])
    assert plan(y).item() == pytest.approx(3.0 + 70.0 + 800.0)
    want = np.zeros((3, 4))
    want[rows, y] = [1.0, 10.0, 100.0]
    np.testing.assert_array_equal(table.grad.numpy(), want)


def test_constant_index_arrays_stay_part_of_the_graph() -> None:
    index = np.array([2, 0])
    plan = pb.compile(lambda x: x[index] * 2.0, np.arange(3.0))
    np.testing.assert_array_equal(plan(np.array([5.0, 6.0, 7.0])).numpy(), [14.0, 10.0])


def test_boolean_masks_from_the_inputs_are_refused() -> None:
    with pytest.raises(LoweringError, match=r"getitem takes a boolean mask .*\(3, 4\) bool"):
        pb.compile(lambda x: x[x > 5.0], np.arange(12.0).reshape(3, 4))
