"""MultiheadAttention and TransformerEncoderLayer exported to ONNX (attention spelled out
as MatMul, Softmax and Where): the files pass onnx.checker, and onnxruntime and
pullback.onnx.load give pullback's outputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from graphs import run_onnxruntime

import pullback as pb
import pullback.onnx
from pullback import nn

E, HEADS = 8, 2


class SelfAttention(nn.Module):
    """Self-attention with a fixed mask (its row 1 hides every key) or a causal one."""

    def __init__(self, causal: bool):
        super().__init__()
        self.attn = nn.MultiheadAttention(E, HEADS)
        self.causal = causal
        self.mask = np.zeros((5, 5), dtype=bool)
        self.mask[1] = True
        self.mask[3, :2] = True

    def forward(self, x):
        if self.causal:
            return self.attn(x, x, x, is_causal=True)[0]
        return self.attn(x, x, x, attn_mask=self.mask)[0]


class CrossAttention(nn.Module):
    """Attention from x to memory, keys hidden by a padding mask given as an input."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(E, HEADS)

    def forward(self, x, memory, padding):
        return self.attn(x, memory, memory, key_padding_mask=padding)[0]


def _inputs(case: str) -> tuple:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, E)).astype(np.float32)
    if case != "cross_attention_padding_input":
        return (x,)
    padding = np.zeros((2, 6), dtype=bool)
    padding[0, 4:] = True
    return x, rng.standard_normal((2, 6, E)).astype(np.float32), padding


CASES = {
    "self_attention_dead_row": lambda: SelfAttention(causal=False),
    "self_attention_causal": lambda: SelfAttention(causal=True),
    "cross_attention_padding_input": CrossAttention,
    "encoder_layer_gelu_causal": lambda: _Causal(nn.TransformerEncoderLayer(
        E, HEADS, 16, activation="gelu", norm_first=True)),
}


class _Causal(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x, is_causal=True)


@pytest.mark.parametrize("case", CASES)
def test_attention_layers_export_and_run_in_onnxruntime(case, tmp_path) -> None:
    pb.manual_seed(1)
    module = CASES[case]()
    module.eval()
    xs = _inputs(case)
    path = tmp_path / "model.onnx"
    proto = pullback.onnx.export(module, xs if len(xs) > 1 else xs[0], path)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    assert {"MatMul", "Softmax"} <= {n.op_type for n in proto.graph.node}
    with pb.no_grad():
        expected = module(*(pb.tensor(x) for x in xs)).numpy()
    assert np.isfinite(expected).all()
    names = [i.name for i in proto.graph.input]
    (runtime,) = run_onnxruntime(path.read_bytes(), dict(zip(names, xs)))
    np.testing.assert_allclose(runtime, expected, rtol=1e-5, atol=1e-5)
    (reloaded,) = pullback.onnx.load(path)(*xs)
    np.testing.assert_allclose(np.asarray(reloaded), expected,
                               rtol=1e-5, atol=1e-5)
