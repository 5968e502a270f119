"""An ONNX model's BatchNormalization folds into the Conv before it, once, when its plan
is built (its initializers are constants), and each Conv runs with its bias, residual
Add and Relu as one step: outputs as the graph run node by node, and as onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from graphs import graph_model, onnx, run_onnxruntime, value_info

import pullback as pb
import pullback.onnx

helper = onnx.helper


def _residual_block(dtype: np.dtype) -> tuple[bytes, np.ndarray]:
    """x -> Conv-BN-Relu -> Conv(bias)-BN, plus x -> Conv 1x1-BN, Add, Relu; and an input."""
    rng = np.random.default_rng(0)
    inits: dict[str, np.ndarray] = {}

    def conv_bn(name: str, source: str, c: int, k: int, bias: bool) -> tuple[list, str]:
        inits[f"{name}_w"] = rng.standard_normal((4, c, k, k)).astype(dtype)
        conv_in = [source, f"{name}_w"]
        if bias:
            inits[f"{name}_b"] = rng.standard_normal(4).astype(dtype)
            conv_in.append(f"{name}_b")
        for stat, values in (("s", rng.standard_normal(4)), ("b2", rng.standard_normal(4)),
                             ("m", rng.standard_normal(4)), ("v", rng.random(4) + 0.5)):
            inits[f"{name}_{stat}"] = values.astype(dtype)
        nodes = [helper.make_node("Conv", conv_in, [f"{name}_c"], pads=[k // 2] * 4),
                 helper.make_node("BatchNormalization",
                                  [f"{name}_c", *(f"{name}_{s}" for s in ("s", "b2", "m", "v"))],
                                  [f"{name}_bn"], epsilon=1e-3)]
        return nodes, f"{name}_bn"

    first, a = conv_bn("a", "x", 3, 3, False)
    second, b = conv_bn("b", "a_relu", 4, 3, True)
    short, s = conv_bn("s", "x", 3, 1, False)
    nodes = [*first, helper.make_node("Relu", [a], ["a_relu"]), *second, *short,
             helper.make_node("Add", [b, s], ["sum"]), helper.make_node("Relu", ["sum"], ["y"])]
    x = rng.standard_normal((2, 3, 5, 5)).astype(dtype)
    model = graph_model(nodes, [value_info("x", x)], [value_info("y", dtype, [2, 4, 5, 5])],
                        inits)
    return model, x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batch_norms_fold_and_epilogues_fuse(dtype):
    data, x = _residual_block(dtype)
    model = pullback.onnx.load(data)
    (got,) = model(x)
    with pb.no_grad():
        (by_node,) = model.forward(x)  # node by node, nothing folded
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}
    np.testing.assert_allclose(got.numpy(), by_node.numpy(), **tol)
    if dtype == np.float32:  # onnxruntime's CPU Conv is float32 only
        np.testing.assert_allclose(got.numpy(), run_onnxruntime(data, {"x": x})[0], **tol)
    (runner,) = model._runners.values()
    text = runner.plan.explain()
    assert text.count("computed once, at lowering") == 3
    steps = [step.name for step in runner.plan._schedule]
    assert steps == ["fused(conv2d, add, relu)", "fused(conv2d, add)",
                     "fused(conv2d, add, add, relu)"]


def _conv_bn(dtype: np.dtype, batch_norm: bool) -> tuple[bytes, np.ndarray]:
    """One sample through a 3x3 Conv of 16 channels on 16x16 maps (16 tiles: im2col's,
    unless Winograd's transform is kept), a BatchNormalization (folded into its weights)
    when asked, and a Relu."""
    rng = np.random.default_rng(3)
    inits = {"w": rng.standard_normal((16, 16, 3, 3)).astype(dtype)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4)]
    last = "c"
    if batch_norm:
        for name, values in (("s", rng.standard_normal(16)), ("b", rng.standard_normal(16)),
                             ("m", rng.standard_normal(16)), ("v", rng.random(16) + 0.5)):
            inits[name] = values.astype(dtype)
        nodes.append(helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"]))
        last = "n"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    x = rng.standard_normal((1, 16, 16, 16)).astype(dtype)
    return graph_model(nodes, [value_info("x", x)], [value_info("y", dtype, [1, 16, 16, 16])],
                       inits), x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_folded_kernels_winograd_transform_is_made_once(dtype, monkeypatch):
    """A Conv whose BatchNormalization folds into its weights: the folded weights are
    computed at lowering and only the plan holds them, so it promises them constant
    (`constant_weights`) and Winograd's transform of them is made at the first call and
    kept; outputs as node by node and, in float32, as onnxruntime's."""
    from pullback.backend import winograd

    data, x = _conv_bn(dtype, batch_norm=True)
    transforms = []
    plain = winograd.weight_transform
    monkeypatch.setattr(winograd, "weight_transform",
                        lambda kernels: transforms.append(kernels.shape) or plain(kernels))
    model = pullback.onnx.load(data)
    outputs = [model(x)[0].numpy() for _ in range(3)]
    assert transforms == [(16, 16, 3, 3)]
    with pb.no_grad():
        (by_node,) = model.forward(x)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == np.float32 else {"rtol": 1e-11, "atol": 1e-11}
    for got in outputs:
        np.testing.assert_allclose(got, by_node.numpy(), **tol)
    if dtype == np.float32:
        np.testing.assert_allclose(outputs[0], run_onnxruntime(data, {"x": x})[0], **tol)


def test_an_initializer_or_a_callers_array_is_not_promised_constant(monkeypatch):
    """Weights the plan did not compute (an initializer used as it is, an array a
    function closes over) may be changed in place between calls, and the plan then
    computes with the new values: nothing derived from them is kept."""
    from pullback import ops
    from pullback.backend import conv as backend_conv
    from pullback.backend import winograd

    transforms = []
    plain = winograd.weight_transform
    monkeypatch.setattr(winograd, "weight_transform",
                        lambda kernels: transforms.append(kernels.shape) or plain(kernels))
    data, x = _conv_bn(np.float32, batch_norm=False)
    model = pullback.onnx.load(data)
    model(x)
    model(x)
    assert transforms == []  # im2col at every call: 16 tiles, no transform kept
    w = np.random.default_rng(5).standard_normal((16, 16, 3, 3)).astype(np.float32)
    t = pb.tensor(x)
    plan = pb.compile(lambda v: ops.conv2d(v, w, padding=1).relu(), t)
    before = plan(t).numpy()
    w[0] += 1.0
    after = plan(t).numpy()
    np.testing.assert_allclose(after, ops.conv2d(t, w, padding=1).relu().numpy(), rtol=1e-5,
                               atol=1e-5)
    assert not np.allclose(before, after) and id(w) not in backend_conv._TRANSFORMS


def test_a_modules_weights_are_not_promised_constant():
    """An inference plan of a module: its convolution's weights are a parameter, which
    may change in place between calls (an optimizer's step), so nothing derived from
    them is kept; the plan's output follows them."""
    from pullback import nn
    from pullback.backend import conv as backend_conv

    conv = nn.Conv2d(16, 16, 3, padding=1, bias=False)
    x = pb.tensor(np.random.default_rng(4).standard_normal((1, 16, 16, 16)).astype(np.float32))
    plan = pb.compile(lambda t: conv(t).relu(), x)
    before = plan(x).numpy()
    kept = dict(backend_conv._TRANSFORMS)
    with pb.no_grad():
        conv.weight.copy_(conv.weight + 1.0)
    after = plan(x).numpy()
    with pb.no_grad():
        expected = conv(x).relu().numpy()
    np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(before, after) and kept == backend_conv._TRANSFORMS
