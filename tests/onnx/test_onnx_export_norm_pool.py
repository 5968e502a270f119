"""ONNX export of BatchNorm1d/2d (BatchNormalization, the running statistics as
initializers), AvgPool2d and AdaptiveAvgPool2d (AveragePool) and Conv1d (Conv between
Reshapes): onnxruntime runs each file to pullback's eval outputs, and
pullback.onnx.load reads it back to the same outputs (the round trip)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from graphs import run_onnxruntime

import pullback as pb
import pullback.onnx
from pullback import nn
from pullback.onnx.exporters import ExportError


def _trained(module: nn.Module, shape: tuple, steps: int = 2) -> nn.Module:
    """`module` after a few training-mode forwards, so its running statistics are not
    the initial zeros and ones (an export that ignored them would still pass)."""
    rng = np.random.default_rng(6)
    with pb.no_grad():
        for _ in range(steps):
            module(pb.tensor((rng.standard_normal(shape) * 3 + 2).astype(np.float32)))
    return module.eval()


def _export_and_compare(module: nn.Module, x: np.ndarray, tmp_path) -> onnx.ModelProto:
    path = tmp_path / "model.onnx"
    proto = pullback.onnx.export(module, x, path)
    with pb.no_grad():
        expected = module(pb.tensor(x)).numpy()
    (runtime,) = run_onnxruntime(path.read_bytes(), {"input": x})
    np.testing.assert_allclose(runtime, expected, rtol=1e-5, atol=1e-5)
    (reloaded,) = pullback.onnx.load(path)(x)  # a model's outputs, as a list
    np.testing.assert_allclose(np.asarray(reloaded), expected, rtol=1e-5, atol=1e-5)
    return proto


def test_cnn_block_with_batch_norm_and_pools_exports(tmp_path) -> None:
    pb.manual_seed(1)
    shape = (2, 3, 10, 10)  # the global pool's 5x5 window: the general pooling kernel
    module = _trained(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4),
                                    nn.ReLU(), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1),
                                    nn.Flatten()), shape)
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    proto = _export_and_compare(module, x, tmp_path)
    kinds = [n.op_type for n in proto.graph.node]
    assert kinds.count("BatchNormalization") == 1 and kinds.count("AveragePool") == 2
    initializers = {i.name for i in proto.graph.initializer}
    assert {"1.running_mean", "1.running_var", "1.weight", "1.bias"} <= initializers


def test_conv1d_and_batch_norm1d_without_affine_export(tmp_path) -> None:
    pb.manual_seed(2)
    shape = (2, 3, 9)
    module = _trained(nn.Sequential(nn.Conv1d(3, 4, 3, stride=2, padding=1),
                                    nn.BatchNorm1d(4, affine=False)), shape)
    x = np.random.default_rng(8).standard_normal(shape).astype(np.float32)
    proto = _export_and_compare(module, x, tmp_path)
    assert {"Conv", "BatchNormalization"} <= {n.op_type for n in proto.graph.node}


def test_batch_norm_in_training_mode_does_not_export(tmp_path) -> None:
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ExportError, match="batch_norm: training mode"):
        pullback.onnx.export(lambda v: pb.batch_norm(v, None, None, training=True), x,
                             tmp_path / "f.onnx")
