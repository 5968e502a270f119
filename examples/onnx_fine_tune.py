"""Fine-tune an ONNX model: load it with trainable weights and train it with a plan.

The script builds a small "pretrained" classifier with `onnx.helper` (Gemm, Relu,
Gemm: what exporters write for an MLP), so nothing downloads. It loads the model
twice: for inference (the outputs match NumPy's), and with `trainable=True`,
where its weight initializers become parameters. A TRAINING plan fine-tunes it
on a new labelling, and the result is exported back to ONNX.

Needs the onnx package (`pip install 'pullback[onnx]'`).
Run: python examples/onnx_fine_tune.py [--steps N]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import cast

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import pullback as pb
import pullback.onnx
from pullback import nn, optim

RNG = np.random.default_rng(0)
W1, B1 = RNG.normal(0, 0.5, (16, 8)).astype(np.float32), np.zeros(16, np.float32)
W2, B2 = RNG.normal(0, 0.5, (3, 16)).astype(np.float32), np.zeros(3, np.float32)


def build_model() -> onnx.ModelProto:
    """x (batch, 8) -> Gemm(W1) -> Relu -> Gemm(W2) -> logits (batch, 3)."""
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["a"]),
        helper.make_node("Gemm", ["a", "w2", "b2"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(a, name) for a, name in
                     ((W1, "w1"), (B1, "b1"), (W2, "w2"), (B2, "b2"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    steps = parser.parse_args().steps
    proto = build_model()
    x = RNG.normal(size=(32, 8)).astype(np.float32)
    labels = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)  # a new task: classes 0, 1, 2

    # Inference: the same numbers as the graph computed by hand.
    (logits,) = pullback.onnx.load(proto)(x)
    by_hand = np.maximum(x @ W1.T + B1, 0) @ W2.T + B2
    np.testing.assert_allclose(np.asarray(logits), by_hand, rtol=1e-5, atol=1e-5)
    print("inference matches NumPy")

    # Fine-tuning: weights become parameters; the plan is lowered once, then replayed.
    model = pullback.onnx.load(proto, trainable=True)
    print("initializers:", model.trainable_initializers())
    opt = optim.Adam(model.parameters(), 0.01)

    def loss_of(x: pb.Tensor, y: pb.Tensor) -> pb.Tensor:
        # A model's outputs may be strings or sequences as ONNX allows; this one's is
        # numeric, a Tensor (the cast tells the type checker, and does nothing).
        (logits,) = model(x)
        return nn.cross_entropy(cast(pb.Tensor, logits), y)

    step = pb.compile(loss_of, x, labels, mode=pb.LoweringMode.TRAINING)
    for i in range(steps):
        opt.zero_grad()
        loss = step(x, labels)
        opt.step()
        if i in (0, steps - 1):
            print(f"step {i}: loss {float(loss):.4f}")
    accuracy = (np.asarray(model(x)[0]).argmax(1) == labels).mean()
    print(f"train accuracy after fine-tuning: {accuracy:.2f}")

    # The fine-tuned model is a module: export it back to ONNX.
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "fine_tuned.onnx")
        pullback.onnx.export(model, x, path)
        (again,) = pullback.onnx.load(path)(x)
        np.testing.assert_allclose(np.asarray(again), np.asarray(model(x)[0]), rtol=1e-5,
                                   atol=1e-5)
    print("exported and reloaded")


if __name__ == "__main__":
    main()
