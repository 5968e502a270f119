"""Elementwise ONNX ops: arithmetic, activations and their compositions (Elu, Selu,
PRelu, LeakyRelu, Shrink are written with relu/minimum so that infinities pass
through as the ONNX reference computes them, and no condition is baked into a plan)."""

from __future__ import annotations

import math
from functools import reduce
from typing import Any

import numpy as np

from ... import ops
from ..errors import OnnxImportError
from ..registry import NodeView, converter
from .common import broadcast_shape, constant, dtype, legacy_broadcast, shape

_LEGACY = ("broadcast", "axis")


def _binary(op_type: str, fn: Any) -> None:
    @converter(op_type, (6, 7, 13, 14), _LEGACY)
    def convert(node: NodeView, a: Any, b: Any) -> Any:
        b = legacy_broadcast(node, a, b)
        if dtype(a) != dtype(b):
            raise OnnxImportError(f"operands have different dtypes {dtype(a)} and {dtype(b)}")
        return fn(a, b)


_binary("Add", ops.add)
_binary("Sub", ops.sub)
_binary("Mul", ops.mul)


def _divide(a: Any, b: Any) -> Any:
    if dtype(a).kind in "iu":
        # ONNX integer division truncates toward zero (as C does), not toward -inf.
        raise OnnxImportError("integer Div is not implemented")
    return ops.div(a, b)


_binary("Div", _divide)


@converter("Pow", (1, 7, 12, 13, 15), _LEGACY)
def _pow(node: NodeView, a: Any, b: Any) -> Any:
    b = legacy_broadcast(node, a, b) if node.since == 1 else b
    if dtype(a).kind != "f":
        raise OnnxImportError(f"Pow of a {dtype(a)} base is not implemented")
    if dtype(b) != dtype(a):
        b = ops.astype(b, dtype(a))  # the exponent may be of another type (opset 12)
    return ops.pow(a, b)


def _unary(op_type: str, fn: Any, versions: tuple = (6, 13)) -> None:
    @converter(op_type, versions)
    def convert(node: NodeView, x: Any) -> Any:
        return fn(x)


_unary("Abs", ops.abs)
_unary("Neg", ops.neg)
_unary("Exp", ops.exp)
_unary("Log", ops.log)
_unary("Sqrt", ops.sqrt)
_unary("Relu", ops.relu, (6, 13, 14))
_unary("Sigmoid", ops.sigmoid)
_unary("Tanh", ops.tanh)
_unary("Softplus", ops.softplus, (1,))
_unary("Sign", ops.sign, (9, 13))
_unary("Identity", lambda x: x, (1, 13, 14, 16))
_unary("Erf", ops.erf, (9, 13))
_unary("Sin", ops.sin, (7,))
_unary("Cos", ops.cos, (7,))


def _comparison(op_type: str, fn: Any, versions: tuple) -> None:
    @converter(op_type, versions)
    def convert(node: NodeView, a: Any, b: Any) -> Any:
        if dtype(a) != dtype(b):
            raise OnnxImportError(f"operands have different dtypes {dtype(a)} and {dtype(b)}")
        broadcast_shape(shape(a), shape(b))
        return fn(a, b)


_comparison("Less", ops.less, (7, 9, 13))
_comparison("Greater", ops.greater, (7, 9, 13))
_comparison("LessOrEqual", ops.less_equal, (12, 16))
_comparison("GreaterOrEqual", ops.greater_equal, (12, 16))
_comparison("Equal", ops.equal, (7, 11, 13))


@converter("Not", (1,))
def _not(node: NodeView, x: Any) -> Any:
    if dtype(x) != np.bool_:
        raise OnnxImportError(f"Not takes a bool tensor, not {dtype(x)}")
    return ops.equal(x, np.zeros((), np.bool_))


@converter("Where", (9, 16))
def _where(node: NodeView, cond: Any, a: Any, b: Any) -> Any:
    # pb.where reads its condition afresh at every plan call (a traced parameter).
    if dtype(cond) != np.bool_:
        raise OnnxImportError(f"Where takes a bool condition, not {dtype(cond)}")
    if dtype(a) != dtype(b):
        raise OnnxImportError(f"operands have different dtypes {dtype(a)} and {dtype(b)}")
    broadcast_shape(broadcast_shape(shape(cond), shape(a)), shape(b))
    return ops.where(cond, a, b)


@converter("Elu", (6,), ("alpha",))
def _elu(node: NodeView, x: Any) -> Any:
    alpha = node.attr("alpha", 1.0)
    negative = ops.sub(ops.exp(ops.minimum(x, constant(0.0, x))), 1.0)
    return ops.add(ops.relu(x), ops.mul(negative, alpha))


@converter("Selu", (6,), ("alpha", "gamma"))
def _selu(node: NodeView, x: Any) -> Any:
    alpha = node.attr("alpha", 1.67326319217681884765625)
    gamma = node.attr("gamma", 1.05070102214813232421875)
    negative = ops.sub(ops.exp(ops.minimum(x, constant(0.0, x))), 1.0)
    return ops.mul(ops.add(ops.relu(x), ops.mul(negative, alpha)), gamma)


@converter("LeakyRelu", (6, 16), ("alpha",))
def _leaky_relu(node: NodeView, x: Any) -> Any:
    alpha = node.attr("alpha", 0.01)
    return ops.add(ops.relu(x), ops.mul(ops.minimum(x, constant(0.0, x)), alpha))


@converter("PRelu", (6, 7, 9, 16))
def _prelu(node: NodeView, x: Any, slope: Any) -> Any:
    sx, ss = shape(x), shape(slope)
    if node.since < 7 and len(ss) == 1 and len(sx) >= 2 and ss[0] == sx[1] and ss[0] != 1:
        # Opset 6 PRelu took a per-channel slope of shape (C,) for NCHW data.
        slope = ops.reshape(slope, (1, ss[0]) + (1,) * (len(sx) - 2))
    else:
        broadcast_shape(sx, ss)  # unidirectional: the slope broadcasts to x
    return ops.add(ops.relu(x), ops.mul(ops.minimum(x, constant(0.0, x)), slope))


@converter("Shrink", (9,), ("bias", "lambd"))
def _shrink(node: NodeView, x: Any) -> Any:
    bias, lambd = node.attr("bias", 0.0), node.attr("lambd", 0.5)
    # x - bias above lambd, x + bias below -lambd, 0 between: two ramps plus two steps.
    above = ops.astype(ops.greater(x, lambd), dtype(x))
    below = ops.astype(ops.less(x, -lambd), dtype(x))
    ramps = ops.sub(ops.relu(ops.sub(x, lambd)), ops.relu(ops.sub(ops.neg(x), lambd)))
    return ops.add(ramps, ops.mul(ops.sub(above, below), lambd - bias))


@converter("Clip", (6, 11, 12, 13), ("min", "max"), static_inputs=(1, 2))
def _clip(node: NodeView, x: Any, lo: Any = None, hi: Any = None) -> Any:
    if node.since < 11:
        lo, hi = node.attr("min", -math.inf), node.attr("max", math.inf)
    else:
        lo = None if lo is None else node.static(lo, "min").item()
        hi = None if hi is None else node.static(hi, "max").item()
    return ops.clip(x, lo, hi)  # min > max sets every element to max, in ONNX as in NumPy


def _variadic(op_type: str, fn: Any, versions: tuple) -> None:
    @converter(op_type, versions)
    def convert(node: NodeView, *xs: Any) -> Any:
        if not xs:
            raise OnnxImportError("needs at least one input")
        if node.since < 8 and len({shape(x) for x in xs}) > 1:
            raise OnnxImportError("inputs must share one shape before opset 8")
        if len({dtype(x) for x in xs}) > 1:
            raise OnnxImportError("inputs have different dtypes")
        if len(xs) == 1:
            return xs[0]
        return reduce(fn, xs)


_variadic("Sum", ops.add, (6, 8, 13))
_variadic("Max", ops.maximum, (6, 8, 12, 13))
_variadic("Min", ops.minimum, (6, 8, 12, 13))
