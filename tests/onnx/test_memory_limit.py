"""`load(..., max_tensor_bytes=N)` bounds every tensor a model computes, not only those
it declares: a small model whose nodes would build a large result (broadcasting, a
matmul's outer product, huge strides, pads or kernels, many-way concatenation) is
refused before the result is allocated, in a plan as while recording, with the node,
its op type, the shape and the limit named; peak memory stays near the limit."""

from __future__ import annotations

import contextlib
import tracemalloc

import numpy as np
import pytest
from graphs import FLOAT, graph_model, node_model
from onnx import helper

import pullback.onnx
from pullback.onnx import NodeError, OnnxImportError
from pullback.onnx.ops.pool import _window_counts

LIMIT = 1 << 20  # 1 MiB
LIMIT_TEXT = "over the limit of 1,048,576"

_A = np.ones((5000, 1), np.float32)
_B = np.ones((1, 5000), np.float32)
_X = np.ones((1, 1, 2, 2), np.float32)
_W = np.ones((1, 1, 1, 1), np.float32)
_ROW = np.ones((1, 100), np.float32)
_IMAGE = np.ones((1, 1, 200, 200), np.float32)
_KERNEL = np.ones((1, 1, 100, 100), np.float32)


def _concat_model() -> bytes:
    node = helper.make_node("Concat", ["s"] * 3000, ["y"], axis=0, name="concat_node")
    return graph_model([node], [helper.make_tensor_value_info("s", FLOAT, [1, 100])],
                       [helper.make_tensor_value_info("y", FLOAT, [3000, 100])])


# name: (model, inputs, the node's op type and name, the refused shape as printed)
CASES = {
    "broadcasting Add": (lambda: node_model("Add", {"a": _A, "b": _B}), (_A, _B),
                         "Add node 'add_node'", "(5000, 5000) float32"),
    "broadcasting Where": (lambda: node_model("Where", {"c": _A > 0, "a": _A, "b": _B},
                                              output_types=[np.float32]),
                           (_A > 0, _A, _B), "Where node 'where_node'", "(5000, 5000) float32"),
    "MatMul outer product": (lambda: node_model("MatMul", {"a": _A, "b": _B}), (_A, _B),
                             "MatMul node 'matmul_node'", "(5000, 5000) float32"),
    "ConvTranspose huge strides": (
        lambda: node_model("ConvTranspose", {"x": _X}, {"strides": [3000, 3000]},
                           constants={"w": _W}),
        (_X,), "ConvTranspose node 'convtranspose_node'", "(1, 1, 3001, 3001) float32"),
    "Conv huge pads": (lambda: node_model("Conv", {"x": _X}, {"pads": [3000] * 4},
                                          constants={"w": _W}),
                       (_X,), "Conv node 'conv_node'", "(1, 1, 1, 6002, 6002) float32"),
    # A small result, but pb.conv2d would unfold 408 MB of windows to compute it.
    "Conv huge kernel": (lambda: node_model("Conv", {"x": _IMAGE}, constants={"w": _KERNEL}),
                         (_IMAGE,), "Conv node 'conv_node'", "(1, 100, 100, 101, 101) float32"),
    # The explicit pad before the pool is refused: its second axis alone is 72 MB.
    "MaxPool huge pads": (lambda: node_model("MaxPool", {"x": _X},
                                             {"kernel_shape": [1, 1], "pads": [3000] * 4}),
                          (_X,), "MaxPool node 'maxpool_node'", "(1, 1, 6002, 3000) float32"),
    "Concat": (_concat_model, (_ROW,), "Concat node 'concat_node'", "(3000, 100) float32"),
}


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    with contextlib.suppress(OnnxImportError):
        fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


@pytest.mark.parametrize("path", ["plan", "recorded"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_node_result_is_bounded_before_it_is_allocated(case, path):
    make, inputs, node, shape = CASES[case]
    model = pullback.onnx.load(make(), max_tensor_bytes=LIMIT)
    # A plan is traced on the first call; forward() runs the nodes op by op, recorded.
    call = model if path == "plan" else model.forward
    with pytest.raises(NodeError) as err:
        call(*inputs)
    message = str(err.value)
    assert message.startswith(node), message
    assert shape in message and LIMIT_TEXT in message, message
    assert _peak_bytes(lambda: call(*inputs)) < 2 * LIMIT


def test_a_model_within_the_limit_still_runs_under_it():
    a, b = _A[:50], _B[:, :50]
    model = pullback.onnx.load(node_model("MatMul", {"a": a, "b": b}), max_tensor_bytes=LIMIT)
    (y,) = model(a, b)
    np.testing.assert_array_equal(np.asarray(y), a @ b)


def test_constant_of_shape_within_the_limit_still_fills():
    shape = np.asarray([3, 4], np.int64)
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"], name="fill",
                              value=helper.make_tensor("v", FLOAT, [1], [2.5])),
             helper.make_node("Add", ["x", "c"], ["y"], name="add")]
    model = pullback.onnx.load(graph_model(
        nodes, [helper.make_tensor_value_info("x", FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", FLOAT, [3, 4])], {"s": shape}),
        max_tensor_bytes=LIMIT)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(np.asarray(model(x)[0]), x + 2.5)


def test_an_input_over_the_limit_is_refused():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    model = pullback.onnx.load(graph_model(nodes, [helper.make_tensor_value_info("x", FLOAT,
                                                                               ["n", "m"])],
                                           [helper.make_tensor_value_info("y", FLOAT,
                                                                          ["n", "m"])]),
                               max_tensor_bytes=LIMIT)
    big = np.ones((1024, 512), np.float32)  # 2 MiB
    with pytest.raises(OnnxImportError, match=r"input 'x' of shape \(1024, 512\) float32 "
                                              r"needs 2,097,152 bytes, " + LIMIT_TEXT):
        model(big)
    with pytest.raises(OnnxImportError, match=r"input 'x' .*" + LIMIT_TEXT):
        model.forward(big)



def test_average_pool_counts_follow_the_output_not_the_pads():
    # Five windows of 200,000 elements over a 4-element input: each averages the
    # whole input. Counting each window's real elements builds nothing the size of the
    # padded axis (it took a 1.6 MB array and a Python loop over the kernel).
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 4)
    model = pullback.onnx.load(node_model("AveragePool", {"x": x}, {
        "kernel_shape": [200_000], "pads": [100_000, 100_000]}), max_tensor_bytes=LIMIT)
    (y,) = model(x)
    np.testing.assert_allclose(np.asarray(y), np.full((1, 1, 5), x.mean()), rtol=1e-6)
    tracemalloc.start()
    counts = _window_counts((4,), (200_000,), (1,), (1,), [100_000], [100_000], [5],
                            False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    np.testing.assert_array_equal(counts, np.full((1, 1, 5), 4.0))
    assert peak < 64 * 1024
