"""nn.LSTM and nn.GRU export as ONNX LSTM / GRU nodes and run in onnxruntime with
pullback's outputs, final states included."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import pullback as pb
from pullback import nn
from pullback.onnx import to_model


def _run(model, feeds: dict) -> list:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("kind, bias", [("LSTM", True), ("GRU", False), ("GRU", True)])
def test_recurrent_layers_export_as_onnx_nodes_with_the_same_outputs(kind, bias):
    pb.manual_seed(0)
    layer = getattr(nn, kind)(5, 6, num_layers=2, bias=bias, batch_first=kind == "LSTM")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    states = [rng.standard_normal((2, 3 if kind == "LSTM" else 4, 6)).astype(np.float32)
              for _ in range(2 if kind == "LSTM" else 1)]

    def forward(x, *hx):
        out, finals = layer(x, tuple(hx) if kind == "LSTM" else hx[0])
        return (out, *finals) if kind == "LSTM" else (out, finals)

    model = to_model(forward, (x, *states))
    assert [n.op_type for n in model.graph.node if n.op_type in ("LSTM", "GRU")] == [kind] * 2
    feeds = {f"input_{i}": v for i, v in enumerate((x, *states))}
    want = forward(pb.tensor(x), *(pb.tensor(s) for s in states))
    got = _run(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-6)
