"""Fine-tuning imported models: which initializers become parameters, gradients with
respect to them (central differences), training through a TRAINING plan against
PyTorch step by step, and a linear model fitted to its least-squares solution."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from graphs import graph_model
from onnx import TensorProto, helper

import pullback as pb
import pullback.onnx
from pullback import nn, optim

FLOAT, DOUBLE = TensorProto.FLOAT, TensorProto.DOUBLE


def _cnn(dtype=np.float32, seed: int = 0) -> tuple[bytes, dict]:
    """Conv (padded) -> BatchNormalization -> Relu -> MaxPool -> Flatten (via a Reshape to a
    shape constant) -> Gemm (transB) -> Relu -> Gemm: x (N, 2, 6, 6) -> (N, 3)."""
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(dtype)
    inits = {"conv.w": f(4, 2, 3, 3) * 0.4, "conv.b": f(4) * 0.1, "bn.scale": 1 + f(4) * 0.1,
             "bn.bias": f(4) * 0.1, "bn.mean": f(4) * 0.1,
             "bn.var": (np.abs(f(4)) + 0.5).astype(dtype),
             "flat": np.asarray([-1, 36], np.int64), "fc1.w": f(8, 36) * 0.2,
             "fc1.b": f(8) * 0.1, "fc2.w": f(8, 3) * 0.4, "fc2.b": f(3) * 0.1}
    elem = FLOAT if dtype == np.float32 else DOUBLE
    nodes = [
        helper.make_node("Conv", ["x", "conv.w", "conv.b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
                         ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Reshape", ["p", "flat"], ["fl"]),
        helper.make_node("Gemm", ["fl", "fc1.w", "fc1.b"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("Gemm", ["a", "fc2.w", "fc2.b"], ["y"]),
    ]
    model = graph_model(nodes, [helper.make_tensor_value_info("x", elem, ["N", 2, 6, 6])],
                        [helper.make_tensor_value_info("y", elem, ["N", 3])], inits)
    return model, inits


WEIGHTS = ["conv.w", "conv.b", "bn.scale", "bn.bias", "fc1.w", "fc1.b", "fc2.w", "fc2.b"]


# ---------------------------------------------------------------- which become parameters


def test_trainable_makes_the_weights_parameters_and_keeps_shapes_and_statistics_constant():
    model = pullback.onnx.load(_cnn()[0], trainable=True)
    assert [name for name, _ in model.named_parameters()] == WEIGHTS
    assert all(p.requires_grad for p in model.parameters())
    status = model.trainable_initializers()
    assert "int64" in status["flat"]
    assert "running statistics" in status["bn.mean"] and "running statistics" in status["bn.var"]
    assert all(status[name] == "trainable" for name in WEIGHTS)


def test_models_load_frozen_by_default():
    model = pullback.onnx.load(_cnn()[0])
    assert model.parameters() == []
    assert isinstance(model, nn.Module)


def test_values_that_feed_a_shape_or_a_bound_stay_constant_whatever_their_dtype():
    """A float feeding a Cast that feeds a Reshape's shape, a Pad's constant and a Clip's
    bounds are read when the plan is built: they cannot be trained."""
    nodes = [helper.make_node("Cast", ["fshape", ], ["ishape"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "ishape"], ["r"], name="reshape"),
             helper.make_node("Clip", ["r", "lo", "hi"], ["c"], name="clip"),
             helper.make_node("Pad", ["c", "pads", "fill"], ["p"], name="pad"),
             helper.make_node("Mul", ["p", "w"], ["y"])]
    inits = {"fshape": np.asarray([2, 3], np.float32), "lo": np.asarray(-1, np.float32),
             "hi": np.asarray(1, np.float32), "pads": np.asarray([0, 1, 0, 1], np.int64),
             "fill": np.asarray(0.5, np.float32), "w": np.ones((2, 5), np.float32)}
    model_bytes = graph_model(nodes, [helper.make_tensor_value_info("x", FLOAT, [6])],
                              [helper.make_tensor_value_info("y", FLOAT, [2, 5])], inits)
    model = pullback.onnx.load(model_bytes, trainable=True)
    assert [name for name, _ in model.named_parameters()] == ["w"]
    status = model.trainable_initializers()
    assert "Cast node" in status["fshape"] and "'reshape'" in status["fshape"]
    assert "'clip' reads it (input 1)" in status["lo"]
    assert "'pad' reads it (input 2)" in status["fill"]
    x = np.arange(6, dtype=np.float32) / 3 - 1
    loss = model(x)[0].sum()
    loss.backward()
    np.testing.assert_allclose(model.parameters()[0].grad.numpy(),
                               np.pad(np.clip(x.reshape(2, 3), -1, 1), ((0, 0), (1, 1)),
                                      constant_values=0.5))


def test_trainable_names_choose_the_parameters_and_refuse_constants():
    model = pullback.onnx.load(_cnn()[0], trainable=["fc2.w", "fc2.b"])
    assert [name for name, _ in model.named_parameters()] == ["fc2.w", "fc2.b"]
    with pytest.raises(pullback.onnx.OnnxImportError) as err:
        pullback.onnx.load(_cnn()[0], trainable=["fc2.w", "flat", "bn.var", "nope"])
    message = str(err.value)
    assert "'flat': it is int64" in message and "'bn.var'" in message
    assert "'nope': no initializer" in message and "fc2.w" not in message
    with pytest.raises(TypeError, match="wrap it in a list"):
        pullback.onnx.load(_cnn()[0], trainable="fc2.w")


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_parameter_gradients_match_central_differences(mode):
    model_bytes, inits = _cnn(np.float64)
    model = pullback.onnx.load(model_bytes, trainable=True)
    x = np.random.default_rng(1).standard_normal((2, 2, 6, 6))
    labels = np.asarray([0, 2])
    start = [pb.tensor(inits[name]) for name in WEIGHTS]

    def loss(*weights):
        (logits,) = model.call_with(dict(zip(WEIGHTS, weights)), x)
        return nn.cross_entropy(logits, labels)

    assert pb.gradcheck(loss, start, mode=mode)


def test_training_plan_gradients_equal_eager_backward():
    model_bytes, _ = _cnn(np.float64)
    model = pullback.onnx.load(model_bytes, trainable=True)
    x = np.random.default_rng(2).standard_normal((3, 2, 6, 6))
    labels = np.asarray([0, 1, 2])
    nn.cross_entropy(model(x)[0], labels).backward()
    eager = {name: p.grad.numpy().copy() for name, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = None
    step = pb.compile(lambda x, y: nn.cross_entropy(model(x)[0], y), x, labels,
                      mode=pb.LoweringMode.TRAINING)
    step(x, labels)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), eager[name], rtol=1e-12, atol=1e-14,
                                   err_msg=name)


def test_inputs_that_require_grad_get_gradients_through_a_frozen_model():
    model = pullback.onnx.load(_cnn(np.float64)[0])
    x = pb.tensor(np.random.default_rng(3).standard_normal((1, 2, 6, 6)), requires_grad=True)
    assert pb.gradcheck(lambda t: model(t)[0].sum(), (x,))


# ---------------------------------------------------------------- fitting


class _TorchCnn(torch.nn.Module):
    """The same graph in PyTorch, from the same initializers."""

    def __init__(self, inits: dict):
        super().__init__()
        t = lambda name: torch.nn.Parameter(torch.tensor(inits[name]))
        self.conv_w, self.conv_b = t("conv.w"), t("conv.b")
        self.scale, self.bias = t("bn.scale"), t("bn.bias")
        self.mean, self.var = torch.tensor(inits["bn.mean"]), torch.tensor(inits["bn.var"])
        self.fc1_w, self.fc1_b, self.fc2_w, self.fc2_b = (t("fc1.w"), t("fc1.b"), t("fc2.w"),
                                                          t("fc2.b"))

    def forward(self, x):
        c = torch.nn.functional.conv2d(x, self.conv_w, self.conv_b, padding=1)
        n = torch.nn.functional.batch_norm(c, self.mean, self.var, self.scale, self.bias,
                                           training=False, eps=1e-5)
        p = torch.nn.functional.max_pool2d(torch.relu(n), 2)
        h = torch.relu(p.reshape(-1, 36) @ self.fc1_w.T + self.fc1_b)
        return h @ self.fc2_w + self.fc2_b

    def weights(self):
        return [self.conv_w, self.conv_b, self.scale, self.bias, self.fc1_w, self.fc1_b,
                self.fc2_w, self.fc2_b]


def test_an_imported_cnn_fits_data_through_a_training_plan_as_pytorch_does():
    model_bytes, inits = _cnn(np.float32, seed=4)
    model = pullback.onnx.load(model_bytes, trainable=True)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((32, 2, 6, 6)).astype(np.float32)
    labels = (x[:, 0, :3].sum(axis=(1, 2)) > 0).astype(np.int64) + (x[:, 1].mean(axis=(1, 2))
                                                                      > 0.2)
    opt = optim.SGD(model.parameters(), 0.05, momentum=0.9)
    step = pb.compile(lambda x, y: nn.cross_entropy(model(x)[0], y), x, labels,
                      mode=pb.LoweringMode.TRAINING)
    reference = _TorchCnn(inits)
    torch_opt = torch.optim.SGD(reference.weights(), 0.05, momentum=0.9)
    losses, torch_losses = [], []
    for _ in range(60):
        opt.zero_grad()
        losses.append(float(step(x, labels)))
        opt.step()
        torch_opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(reference(torch.tensor(x)),
                                                 torch.tensor(labels))
        loss.backward()
        torch_opt.step()
        torch_losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]
    np.testing.assert_allclose(losses, torch_losses, rtol=1e-5, atol=1e-6)
    for (name, p), ref in zip(model.named_parameters(), reference.weights()):
        np.testing.assert_allclose(p.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5,
                                   err_msg=name)
    # Inference afterwards (a plan, no recording) sees the trained weights.
    with pb.no_grad():
        (logits,) = model(x)
    assert model.mode(x) == "plan"
    np.testing.assert_allclose(np.asarray(logits),
                               reference(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-4)


def test_an_imported_linear_model_fits_the_least_squares_solution():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((64, 5))
    truth = rng.standard_normal((5, 2))
    target = x @ truth + 0.5 + 0.1 * rng.standard_normal((64, 2))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["y"])]
    model = pullback.onnx.load(graph_model(
        nodes, [helper.make_tensor_value_info("x", DOUBLE, [64, 5])],
        [helper.make_tensor_value_info("y", DOUBLE, [64, 2])],
        {"w": np.zeros((5, 2)), "b": np.zeros(2)}), trainable=True)
    opt = optim.SGD(model.parameters(), 0.1, momentum=0.5)
    step = pb.compile(lambda x, t: nn.mse_loss(model(x)[0], t), x, target,
                      mode=pb.LoweringMode.TRAINING)
    first = None
    for _ in range(300):
        opt.zero_grad()
        loss = float(step(x, target))
        first = loss if first is None else first
        opt.step()
    design = np.hstack([x, np.ones((64, 1))])
    solution, *_ = np.linalg.lstsq(design, target, rcond=None)
    params = dict(model.named_parameters())
    np.testing.assert_allclose(params["w"].numpy(), solution[:5], atol=1e-6)
    np.testing.assert_allclose(params["b"].numpy(), solution[5], atol=1e-6)
    assert loss < 0.01 * first


# ---------------------------------------------------------------- the module around it


def test_state_dict_round_trips_and_load_state_dict_changes_the_outputs():
    model = pullback.onnx.load(_cnn()[0], trainable=True)
    x = np.random.default_rng(7).standard_normal((2, 2, 6, 6)).astype(np.float32)
    with pb.no_grad():
        before = np.asarray(model(x)[0]).copy()
    state = {name: np.asarray(t) * 0.5 for name, t in model.state_dict().items()}
    model.load_state_dict(state)
    with pb.no_grad():
        after = np.asarray(model(x)[0])
    assert not np.allclose(before, after)
    fresh = pullback.onnx.load(_cnn()[0], trainable=True)
    fresh.load_state_dict(model.state_dict())
    with pb.no_grad():
        np.testing.assert_array_equal(np.asarray(fresh(x)[0]), after)


def test_the_explicit_path_backprops_and_updates_like_backward():
    model_bytes, _ = _cnn(np.float64)
    model = pullback.onnx.load(model_bytes, trainable=True)
    x = np.random.default_rng(8).standard_normal((2, 2, 6, 6))
    logits, trace = model.traced_forward(x)
    grad_x, grads = model.backprop(trace, np.ones_like(np.asarray(logits)))
    assert grad_x.shape == x.shape
    model(x)[0].sum().backward()
    flat = nn.flatten_tree(grads)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(np.asarray(flat[name]), p.grad.numpy(), rtol=1e-12)
    before = {name: p.numpy().copy() for name, p in model.named_parameters()}
    del logits, trace  # the trace keeps the weights it read; update writes into them
    model.update(optim.SGD(model.parameters(), 0.5), grads)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.numpy(), before[name] - 0.5 * np.asarray(flat[name]))


def test_call_with_names_unknown_parameters_and_wrong_shapes():
    model = pullback.onnx.load(_cnn()[0], trainable=["fc2.w"])
    x = np.zeros((1, 2, 6, 6), np.float32)
    with pytest.raises(KeyError, match=r"'fc1.w' is not a parameter.*its parameters: fc2.w"):
        model.call_with({"fc1.w": pb.zeros(8, 36)}, x)
    with pytest.raises(pullback.onnx.OnnxImportError,
                       match=r"'fc2.w' is \(8, 3\) float32; got \(3, 8\) float32"):
        model.call_with({"fc2.w": pb.zeros(3, 8)}, x)


def test_a_graph_with_input_dependent_shapes_cannot_be_compiled_for_training():
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT64),
             helper.make_node("Add", ["s", "xi"], ["target"]),
             helper.make_node("Reshape", ["x", "target"], ["r"], name="data_reshape"),
             helper.make_node("Mul", ["r", "w"], ["y"])]
    model = pullback.onnx.load(graph_model(
        nodes, [helper.make_tensor_value_info("x", FLOAT, [1])],
        [helper.make_tensor_value_info("y", FLOAT, [1])], {"w": np.ones(1, np.float32)}),
        trainable=True)
    x = np.zeros(1, np.float32)
    model(x)[0].sum().backward()  # eagerly, the shape is read from the input: fine
    with pytest.raises(pullback.onnx.OnnxImportError,
                       match=r"depend on input values.*'data_reshape'.*call it eagerly"):
        pb.compile(lambda x: model(x)[0].sum(), x, mode=pb.LoweringMode.TRAINING)
