"""Rule 6 and graph lifetime: arrays a pending backward needs are read-only until the
graph is released (backward) or dropped, and a graph dies with its last tensor."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import numpy as np
import pytest

import pullback as pb


@pytest.fixture
def no_cyclic_gc() -> Iterator[None]:
    """Prove that freeing relies on reference counting alone."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _leaves() -> tuple[pb.Tensor, pb.Tensor]:
    return pb.tensor([1.0, 2.0], requires_grad=True), pb.tensor([3.0, 4.0], requires_grad=True)


# name: (build y from x and w, the tensors whose arrays y's graph saves, op that saves them)
SAVING_OPS = {
    "exp_saves_its_output": (lambda x, w: pb.exp(x), lambda x, w, y: [y], "exp"),
    "mul_saves_both_inputs": (lambda x, w: x * w, lambda x, w, y: [x, w], "mul"),
    "div_saves_both_inputs": (lambda x, w: x / w, lambda x, w, y: [x, w], "div"),
    "log_saves_its_input": (lambda x, w: pb.log(x), lambda x, w, y: [x], "log"),
    "sigmoid_saves_its_output": (lambda x, w: pb.sigmoid(x), lambda x, w, y: [y], "sigmoid"),
}
CASES = pytest.mark.parametrize("case", list(SAVING_OPS), ids=list(SAVING_OPS))


def _saved(case: str) -> tuple[pb.Tensor, pb.Tensor, pb.Tensor, list[pb.Tensor], str]:
    build, saved, op = SAVING_OPS[case]
    x, w = _leaves()
    y = build(x, w)
    return x, w, y, saved(x, w, y), op


def _setitem(t: pb.Tensor, value: float) -> None:
    with pb.no_grad():
        t[0] = value


def _assert_writable(t: pb.Tensor) -> None:
    t.numpy()[0] = 5.0
    assert t.numpy()[0] == 5.0
    _setitem(t, 6.0)
    assert t.numpy()[0] == 6.0


@CASES
def test_writing_a_saved_array_through_numpy_raises(case) -> None:
    _, _, y, saved, _ = _saved(case)
    for t in saved:
        before = t.numpy().copy()
        with pytest.raises(ValueError, match="read-only"):
            t.numpy()[0] = 5.0
        np.testing.assert_array_equal(t.numpy(), before)
    assert y.requires_grad  # the graph is still pending


@CASES
def test_setitem_on_a_saved_tensor_raises_naming_the_op(case) -> None:
    _, _, y, saved, op = _saved(case)
    for t in saved:
        with pytest.raises(RuntimeError, match=rf"pending backward of {op}"):
            _setitem(t, 5.0)
    assert y.requires_grad  # the graph is still pending


@CASES
def test_saved_arrays_become_writable_after_backward(case) -> None:
    x, w, y, saved, _ = _saved(case)
    y.sum().backward()
    for t in [x, w, *saved]:
        _assert_writable(t)


@CASES
def test_saved_arrays_stay_read_only_after_backward_with_retain_graph(case) -> None:
    _, _, y, saved, op = _saved(case)
    y.sum().backward(retain_graph=True)
    for t in saved:
        with pytest.raises(ValueError, match="read-only"):
            t.numpy()[0] = 5.0
        with pytest.raises(RuntimeError, match=op):
            _setitem(t, 5.0)
    y.sum().backward()
    for t in saved:
        _assert_writable(t)


@CASES
def test_dropping_the_graph_without_backward_makes_saved_arrays_writable(case, no_cyclic_gc):
    x, w, y, saved, _ = _saved(case)
    arrays = [t.numpy() for t in saved]
    del y, saved
    for array in arrays:
        array[0] = 5.0
        assert array[0] == 5.0
    _assert_writable(x)
    _assert_writable(w)


def test_unsaved_operands_stay_writable() -> None:
    x, w = _leaves()
    y = pb.exp(x) + w  # exp saves its output, add saves nothing
    assert y._node.inputs is None and y._node.output is None
    _assert_writable(x)
    _assert_writable(w)


def test_array_saved_by_two_nodes_stays_read_only_until_both_are_gone(no_cyclic_gc) -> None:
    x, _ = _leaves()
    y1, y2 = pb.log(x), pb.abs(x)  # both keep x for their backward
    del y1
    with pytest.raises(ValueError, match="read-only"):
        x.numpy()[0] = 5.0
    y2.sum().backward()
    _assert_writable(x)


def test_relu_keeps_its_output_not_its_input() -> None:
    x, _ = _leaves()
    y = pb.relu(x)
    x.numpy()[0] = 5.0  # relu's backward reads y > 0, which is where x > 0
    with pytest.raises(ValueError, match="read-only"):
        y.numpy()[0] = 1.0
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), (y.numpy() > 0).astype(x.dtype))


def test_scaling_by_a_constant_keeps_nothing_so_the_input_stays_writable() -> None:
    # d(x * c)/dx needs only c: rule 4, a backward saves what it needs and nothing else.
    x, w = _leaves()
    y = x * 2.0
    x.numpy()[0] = 5.0
    z = x * w  # with w active too, x is needed by w's gradient
    with pytest.raises(ValueError, match="read-only"):
        x.numpy()[0] = 6.0
    assert y.requires_grad and z.requires_grad


def test_write_through_a_detached_alias_of_a_saved_tensor_raises() -> None:
    x, w = _leaves()
    y = x * w
    alias = x.detach()
    with pytest.raises(RuntimeError, match="mul"):
        alias[0] = 5.0
    assert y.requires_grad


@pytest.mark.parametrize(
    "view",
    [lambda x: x.reshape(2, 1), lambda x: x.reshape(1, 2).T],
    ids=["reshape", "transpose"],
)
def test_writing_the_base_of_a_saved_view_raises(view) -> None:
    x, _ = _leaves()
    w = pb.tensor([[3.0], [4.0]], requires_grad=True)
    y = view(x) * w  # mul saves a view that shares x's memory
    with pytest.raises(ValueError, match="read-only"):
        x.numpy()[0] = 100.0
    with pytest.raises(RuntimeError, match="mul"):
        _setitem(x, 100.0)
    y.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[1.0], [2.0]])


def test_view_taken_while_saved_is_writable_after_backward() -> None:
    x, w = _leaves()
    y = x * w
    with pb.no_grad():
        view = x.reshape(2, 1)
    y.sum().backward()
    _setitem(view, 7.0)
    assert x.numpy()[0] == 7.0


# ---------------------------------------------------------------- graph lifetime


def test_output_node_dies_with_the_output_without_gc(no_cyclic_gc) -> None:
    x, w = _leaves()
    y = pb.tanh(x * w).sum()
    node = weakref.ref(y._node)
    del y
    assert node() is None


def test_saved_intermediate_array_dies_with_the_graph_without_gc(no_cyclic_gc) -> None:
    x, w = _leaves()
    h = pb.exp(x)
    array = weakref.ref(h.numpy())
    y = h * w
    del h
    assert array() is not None  # y's graph still needs it
    del y
    assert array() is None


def test_backward_frees_saved_arrays_while_the_output_lives(no_cyclic_gc) -> None:
    x, w = _leaves()
    h = pb.exp(x)
    array = weakref.ref(h.numpy())
    y = (h * w).sum()
    del h
    y.backward()
    assert array() is None
    assert y.requires_grad


def test_leaf_tensor_is_not_kept_alive_by_the_graph(no_cyclic_gc) -> None:
    x, w = _leaves()
    y = x * w
    leaf = weakref.ref(x)
    del x
    assert leaf() is None
    y.sum().backward()  # the leaf is gone: its gradient has nowhere to go, and no error
    assert w.grad is not None
