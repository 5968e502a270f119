"""pullback.onnx.export: every nn layer kind, functions of primitives, a CNN and an MLP are
written as files that pass onnx.checker (full check), that onnxruntime runs to pullback's
outputs, and that pullback.onnx.load reads back to the same outputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from graphs import run_onnxruntime

import pullback as pb
import pullback.onnx
from pullback import nn, ops

rng = np.random.default_rng(11)


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _reference(module, *xs):
    if isinstance(module, nn.Module):
        module.eval()
    with pb.no_grad():
        out = module(*xs)
    return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]


def _check_export(module, *xs, tmp_path, rtol=1e-5, atol=1e-5):
    """Export, check the file, and compare onnxruntime and the reloaded model with pullback."""
    path = tmp_path / "model.onnx"
    proto = pullback.onnx.export(module, xs if len(xs) > 1 else xs[0], path)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    expected = _reference(module, *xs)
    names = [i.name for i in proto.graph.input]
    runtime = run_onnxruntime(path.read_bytes(), dict(zip(names, xs)))
    reloaded = pullback.onnx.load(path)(*xs)
    assert len(runtime) == len(reloaded) == len(expected)
    for ref, ort_out, back in zip(expected, runtime, reloaded):
        assert ort_out.shape == ref.shape and ort_out.dtype == ref.dtype
        np.testing.assert_allclose(ort_out, ref, rtol=rtol, atol=atol)
        np.testing.assert_allclose(np.asarray(back), ref, rtol=rtol, atol=atol)
    return proto


def _ops(proto) -> set[str]:
    return {n.op_type for n in proto.graph.node}


pb.manual_seed(5)
LAYERS = [
    ("dense", lambda: nn.Dense(6, 4), (3, 6)),
    ("dense_no_bias_batched", lambda: nn.Dense(6, 4, bias=False), (2, 3, 6)),
    ("bias1d", lambda: nn.Sequential(nn.Dense(5, 5), nn.Bias1d(5)), (4, 5)),
    ("conv2d", lambda: nn.Conv2d(3, 4, 3), (2, 3, 7, 7)),
    ("conv2d_stride_padding", lambda: nn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 2)),
     (2, 3, 8, 7)),
    ("conv2d_dilation_groups", lambda: nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2),
     (1, 4, 9, 9)),
    ("relu", lambda: nn.ReLU(), (3, 5)),
    ("sigmoid", lambda: nn.Sigmoid(), (3, 5)),
    ("tanh", lambda: nn.Tanh(), (3, 5)),
    ("gelu_exact", lambda: nn.GELU(), (3, 5)),
    ("gelu_tanh", lambda: nn.GELU("tanh"), (3, 5)),
    ("max_pool2d", lambda: nn.MaxPool2d(2), (2, 3, 6, 6)),
    ("max_pool2d_stride_padding", lambda: nn.MaxPool2d(3, stride=2, padding=1), (2, 3, 7, 7)),
    ("flatten", lambda: nn.Flatten(), (2, 3, 4, 5)),
    ("layer_norm", lambda: nn.LayerNorm(8), (4, 8)),
    ("dropout_in_eval", lambda: nn.Sequential(nn.Dense(5, 5), nn.Dropout(0.5)), (4, 5)),
    ("residual", lambda: nn.Residual(nn.Sequential(nn.Dense(5, 5), nn.Tanh())), (4, 5)),
    ("glu", lambda: nn.GLU(6, 3), (4, 6)),
    ("lr_wrapper", lambda: nn.LR(nn.Dense(4, 2), 0.5), (3, 4)),
]


@pytest.mark.parametrize("make, shape", [(m, s) for _, m, s in LAYERS],
                         ids=[name for name, _, _ in LAYERS])
def test_each_layer_kind_exports_and_runs_alike(make, shape, tmp_path):
    _check_export(make(), f32(*shape), tmp_path=tmp_path)


def test_an_mlp_exports_with_its_parameter_names(tmp_path):
    model = nn.Sequential(nn.Dense(64, 128), nn.ReLU(), nn.Dense(128, 64), nn.GELU(),
                          nn.LayerNorm(64), nn.Dropout(0.2), nn.Dense(64, 10))
    proto = _check_export(model, f32(16, 64), tmp_path=tmp_path)
    initializers = {t.name for t in proto.graph.initializer}
    assert {name for name, _ in model.named_parameters()} <= initializers
    assert [i.name for i in proto.graph.input] == ["input"]
    assert [o.name for o in proto.graph.output] == ["output"]


def test_a_cnn_exports_and_runs_alike(tmp_path):
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Residual(nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.Tanh())),
        nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2), nn.GELU(), nn.Flatten(),
        nn.Dense(16 * 4 * 4, 32), nn.Sigmoid(), nn.Dense(32, 10))
    proto = _check_export(model, f32(4, 3, 16, 16), tmp_path=tmp_path)
    assert {"Conv", "MaxPool", "MatMul", "Erf"} <= _ops(proto)


def test_functions_of_primitives_export(tmp_path):
    def fn(x, y):
        a = pb.avg_pool2d(ops.pad2d(x, (1, 2), value=0.5), 2)
        b = pb.softmax(a.sum(axis=1), axis=-1) + pb.log_softmax(a.mean(axis=(1, 2)))[:, None, :]
        c = pb.concatenate([b[:, ::-1], b[:, 1:2] * 2.0], axis=1)
        d = pb.clip(pb.maximum(c, y[..., :1, :c.shape[2]]), -0.5, None) ** 2
        e = pb.exp(-pb.abs(d)) + pb.sqrt(d + 1.0) - pb.log(d + 2.0) / pb.silu(d + 3.0)
        f = pb.transpose(e, (0, 2, 1)) @ pb.softplus(e)
        g = pb.max(f, axis=-1, keepdims=True) - pb.broadcast_to(f[:, 0:1, 0:1], f.shape)
        mask = (g > 0.1).astype(pb.float32) + (g <= -0.2).astype(pb.float32)
        return g * mask, pb.reshape(f, (f.shape[0], -1))[:, 3]

    _check_export(fn, f32(2, 3, 6, 5), f32(2, 4, 4), tmp_path=tmp_path)


def test_sin_cos_logsumexp_and_cumsum_export(tmp_path):
    def fn(x):
        a = pb.sin(x) * pb.cos(x * 0.5)
        b = pb.logsumexp(a, axis=(0, 2), keepdims=True) + pb.logsumexp(x * 40.0, -1)[:, :, None]
        return pb.cumsum(a - b, 1), pb.logsumexp(x), x.cumsum(-1)

    proto = _check_export(fn, f32(2, 3, 4), tmp_path=tmp_path)
    assert {"Sin", "Cos", "ReduceLogSumExp", "CumSum"} <= _ops(proto)


def test_float64_models_keep_their_dtype(tmp_path):
    model = nn.Sequential(nn.Dense(4, 3, dtype=np.float64), nn.Tanh())
    proto = _check_export(model, rng.standard_normal((2, 4)), tmp_path=tmp_path, rtol=1e-12,
                          atol=1e-12)
    assert proto.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE


def test_export_runs_in_eval_mode_and_restores_training_mode(tmp_path):
    model = nn.Sequential(nn.Dense(5, 5), nn.Dropout(0.9))
    model.train()
    x = f32(8, 5)
    pullback.onnx.export(model, x, tmp_path / "m.onnx")
    assert model.training and model[1].training
    (out,) = run_onnxruntime((tmp_path / "m.onnx").read_bytes(), {"input": x})
    model.eval()
    with pb.no_grad():
        np.testing.assert_allclose(out, np.asarray(model(x)), rtol=1e-6)


def test_an_exported_model_loads_trainable_under_its_parameter_names(tmp_path):
    model = nn.Sequential(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 2))
    pullback.onnx.export(model, f32(3, 4), tmp_path / "m.onnx")
    loaded = pullback.onnx.load(tmp_path / "m.onnx", trainable=True)
    assert [n for n, _ in loaded.named_parameters()] == [n for n, _ in model.named_parameters()]
    for (_, a), (_, b) in zip(loaded.named_parameters(), model.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


class _Cube(pb.CustomOp):
    def forward(self, x):
        return x ** 3


def test_unexportable_primitives_are_all_listed_with_shapes(tmp_path):
    def fn(x, i):
        return _Cube()(x)[np.arange(3), i] + pb.where(x < 1, x, 2.0 * x)[:, 0]

    with pytest.raises(pullback.onnx.ExportError) as err:
        pullback.onnx.export(fn, (f32(3, 4), np.array([0, 1, 3])), tmp_path / "bad.onnx")
    message = str(err.value)
    assert "2 primitives of function cannot be written" in message
    assert "custom op _Cube ((3, 4) float32 -> (3, 4) float32)" in message
    assert "getitem ((3, 4) float32" in message and "computed from the inputs" in message
    assert not (tmp_path / "bad.onnx").exists()


def test_where_exports_with_conditions_from_the_inputs_and_constant_ones(tmp_path):
    mask = np.array([True, False, True, False])

    def fn(x):
        return pb.where(x > 0, x * 3.0, -x) + pb.where(mask, x, 1.0)

    _check_export(fn, f32(3, 4), tmp_path=tmp_path)


def test_dropout_in_a_plain_function_is_named(tmp_path):
    def fn(x):
        return x * ops.dropout_mask(x, 0.5, lambda: np.random.default_rng(0))

    with pytest.raises(pullback.onnx.ExportError, match=r"dropout_mask .*random masks"):
        pullback.onnx.export(fn, f32(3, 4), tmp_path / "bad.onnx")


def test_example_inputs_must_be_arrays_or_tensors(tmp_path):
    with pytest.raises(TypeError, match="example input 0 must be a Tensor or a NumPy array"):
        pullback.onnx.export(nn.ReLU(), [[1.0, 2.0]], tmp_path / "m.onnx")
