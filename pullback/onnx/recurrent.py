"""ONNX export of the sequence primitives as ONNX `LSTM` and `GRU` nodes.

The primitives take the projected input xp (the layer's MatMul and Add before them
export on their own), so the node's X is xp and its W the gate permutation: PyTorch's
gate order (LSTM i f g o, GRU r z n) to ONNX's (i o f c, z r h); R is the recurrent
weight in ONNX's order, GRU's recurrent bias goes in Rb with linear_before_reset=1
(PyTorch's n = tanh(x_n + r (W_hn h + b_hn))). ONNX returns the hidden states and the
final cell only, so of an LSTM's states the exported graph holds the hidden states of
every step and the last cell; the earlier cells are NaN, never silently plausible
numbers.
"""

from __future__ import annotations

import math

import numpy as np

from ..ops.recurrent import gru_sequence_p, lstm_sequence_p
from .exporters import Context, _register

# Per ONNX gate block, the PyTorch gate block it holds.
LSTM_BLOCKS = (0, 3, 1, 2)  # i o f c <- i f g o
GRU_BLOCKS = (1, 0, 2)  # z r h <- r z n


def _rows(blocks: tuple, h: int) -> np.ndarray:
    return np.concatenate([np.arange(b * h, (b + 1) * h) for b in blocks]).astype(np.int64)


def _nan(c: Context, shape: tuple) -> str:
    """A NaN-filled value of `shape` (ConstantOfShape: nothing stored in the file)."""
    helper = c.emit.helper
    fill = helper.make_tensor("value", helper.np_dtype_to_tensor_dtype(np.dtype(c.out.dtype)),
                              [1], [math.nan])
    return c.emit.node("ConstantOfShape", [c.emit.ints(shape, "shape")], value=fill)


def _recurrent(c: Context, op_type: str, blocks: tuple, rb: str | None) -> tuple[str, ...]:
    """The ONNX node on c's operands: returns the names of its outputs (Y, Y_h[, Y_c])."""
    emit, (n, h) = c.emit, c.out.shape[-2:]
    xp, w_hh = c.args[0], c.args[-2 if rb else -1]
    rows = _rows(blocks, h)
    dtype = np.dtype(c.out.dtype)
    w = emit.const(np.eye(len(rows), dtype=dtype)[rows][None], "gate_permutation")
    r = emit.node("Gather", [w_hh, emit.const(rows, "gate_rows")], axis=0)
    r = emit.node("Unsqueeze", [r, emit.ints([0], "axes")])
    if rb is None:
        b = emit.const(np.zeros((1, 2 * len(rows)), dtype), "zero_bias")
    else:
        rb = emit.node("Gather", [rb, emit.const(rows, "gate_rows")], axis=0)
        b = emit.node("Concat", [emit.const(np.zeros(len(rows), dtype), "zero_bias"), rb],
                      axis=0)
        b = emit.node("Unsqueeze", [b, emit.ints([0], "axes")])
    initial = c.args[1:3] if op_type == "LSTM" else c.args[1:2]  # h0 (and c0)
    states = [emit.node("Reshape", [s, emit.ints((1, n, h), "shape")]) for s in initial]
    inputs = [xp, w, r, b, "", *states]
    outputs = [emit.fresh(f"{op_type.lower()}_{name}") for name in
               (("Y", "Y_h", "Y_c") if op_type == "LSTM" else ("Y", "Y_h"))]
    attrs = {"linear_before_reset": 1} if op_type == "GRU" else {}
    emit.nodes.append(emit.helper.make_node(op_type, inputs, outputs, hidden_size=h,
                                            name=emit.fresh(f"{op_type}_{len(emit.nodes)}"),
                                            **attrs))
    return tuple(outputs)


def _lstm(c: Context) -> str:
    _, steps, n, h = c.out.shape
    y, _, y_c = _recurrent(c, "LSTM", LSTM_BLOCKS, None)
    hs = c.emit.node("Reshape", [y, c.emit.ints((1, steps, n, h), "shape")])
    last_c = c.emit.node("Reshape", [y_c, c.emit.ints((1, 1, n, h), "shape")])
    cells = last_c if steps == 1 else c.emit.node(
        "Concat", [_nan(c, (1, steps - 1, n, h)), last_c], axis=1)
    return c.node("Concat", [hs, cells], axis=0)


def _gru(c: Context) -> str:
    y, _ = _recurrent(c, "GRU", GRU_BLOCKS, c.args[3])
    return c.node("Reshape", [y, c.emit.ints(c.out.shape, "shape")])


_register((lstm_sequence_p,), _lstm)
_register((gru_sequence_p,), _gru)
