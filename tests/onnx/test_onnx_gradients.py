"""Converters are compositions of differentiable primitives: gradients through an
imported graph (run eagerly with recording on) agree with central differences. This is
what fine-tuning imported models will rest on."""

from __future__ import annotations

import numpy as np
import pytest
from graphs import graph_model
from onnx import TensorProto, helper

import pullback as pb
import pullback.onnx

rng = np.random.default_rng(3)
DOUBLE = TensorProto.DOUBLE


def _graph() -> bytes:
    """Conv (asymmetric pads) -> BatchNorm -> Elu -> MaxPool (ceil) -> AveragePool (pads)
    -> LRN -> reflect Pad -> Slice -> Flatten -> Gemm -> LogSoftmax."""
    f = lambda *s: rng.standard_normal(s)
    inits = {"w": f(4, 2, 3, 3) * 0.5, "b": f(4), "scale": f(4), "bias": f(4), "mean": f(4),
             "var": np.abs(f(4)) + 0.5, "pads": np.asarray([0, 0, 1, 0, 0, 0, 0, 1], np.int64),
             "starts": np.asarray([1], np.int64), "ends": np.asarray([100], np.int64),
             "axes": np.asarray([3], np.int64), "gw": f(3, 48) * 0.3, "gb": f(3)}
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 0, 0, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["n"]),
        helper.make_node("Elu", ["n"], ["e"], alpha=0.7),
        helper.make_node("MaxPool", ["e"], ["m"], kernel_shape=[2, 2], strides=[2, 2],
                         ceil_mode=1),
        helper.make_node("AveragePool", ["m"], ["a"], kernel_shape=[2, 2], pads=[1, 1, 0, 0]),
        helper.make_node("LRN", ["a"], ["l"], size=3),
        helper.make_node("Pad", ["l", "pads"], ["p"], mode="reflect"),
        helper.make_node("Slice", ["p", "starts", "ends", "axes"], ["s"]),
        helper.make_node("Flatten", ["s"], ["fl"]),
        helper.make_node("Gemm", ["fl", "gw", "gb"], ["g"], transB=1),
        helper.make_node("LogSoftmax", ["g"], ["y"], axis=1),
    ]
    return graph_model(nodes, [helper.make_tensor_value_info("x", DOUBLE, [2, 2, 7, 6])],
                       [helper.make_tensor_value_info("y", DOUBLE, [2, 3])], inits)


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_gradients_through_an_imported_graph_match_central_differences(mode):
    model = pullback.onnx.load(_graph())
    x = rng.standard_normal((2, 2, 7, 6))
    (expected,) = model(x)

    def f(t):  # the graph's nodes run eagerly, recording, on a differentiable input
        with pb.enable_grad():
            return model._run(model._env([t]), eager=True)[0]

    np.testing.assert_allclose(np.asarray(f(pb.tensor(x))), np.asarray(expected), rtol=1e-12)
    assert pb.gradcheck(f, (pb.tensor(x),), mode=mode)
