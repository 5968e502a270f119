"""Neural-network ONNX ops composed of primitives: Gemm, MatMul, softmaxes, reductions
(sums, means, extrema, products, L1 and L2 norms, ArgMax and ArgMin),
CumSum, normalizations in inference mode (BatchNormalization, InstanceNormalization, LRN),
Dropout as the identity."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ... import ops
from ...ops.reduce import cumsum_p  # CumSum's reverse, which pb.cumsum does not take
from ...tensor import Tensor
from ..errors import OnnxImportError
from ..registry import NodeView, converter
from .common import axis_of, dtype, shape


@converter("MatMul", (1, 9, 13))
def _matmul(node: NodeView, a: Any, b: Any) -> Any:
    if dtype(a) != dtype(b):
        raise OnnxImportError(f"operands have different dtypes {dtype(a)} and {dtype(b)}")
    return ops.matmul(a, b)


@converter("Gemm", (6, 7, 9, 11, 13), ("alpha", "beta", "transA", "transB", "broadcast"))
def _gemm(node: NodeView, a: Any, b: Any, c: Any = None) -> Any:
    if len(shape(a)) != 2 or len(shape(b)) != 2:
        raise OnnxImportError("A and B must be matrices")
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    if node.attr("transA", 0):
        a = ops.transpose(a)
    if node.attr("transB", 0):
        b = ops.transpose(b)
    y = ops.matmul(a, b)
    if alpha != 1.0:
        y = ops.mul(y, alpha)
    if c is None or beta == 0.0:
        return y
    if node.since < 7 and not node.attr("broadcast", 0) and shape(c) != shape(y):
        raise OnnxImportError(f"C {shape(c)} must have the output's shape {shape(y)} without "
                              "broadcast=1")
    return ops.add(y, c if beta == 1.0 else ops.mul(c, beta))


def _row_op(op_type: str, fn: Any) -> None:
    @converter(op_type, (1, 11, 13), ("axis",))
    def convert(node: NodeView, x: Any) -> Any:
        sx = shape(x)
        if node.since >= 13:
            return fn(x, axis_of(node, node.attr("axis", -1), len(sx)))
        # Before opset 13 the input is coerced to 2-D at `axis` and normalized per row.
        axis = node.attr("axis", 1)
        axis = axis + len(sx) if axis < 0 else axis
        if not 0 <= axis <= len(sx):
            raise OnnxImportError(f"axis {node.attr('axis', 1)} is out of range for "
                                  f"{len(sx)} dimensions")
        rows = int(np.prod(sx[:axis], dtype=np.int64))
        flat = ops.reshape(x, (rows, int(np.prod(sx[axis:], dtype=np.int64))))
        return ops.reshape(fn(flat, 1), sx)


_row_op("Softmax", ops.softmax)
_row_op("LogSoftmax", ops.log_softmax)


def _reduce(op_type: str, fn: Any, versions: tuple, axes_input_from: int) -> None:
    @converter(op_type, versions, ("axes", "keepdims", "noop_with_empty_axes"),
               static_inputs=(1,))
    def convert(node: NodeView, x: Any, axes: Any = None) -> Any:
        ndim = len(shape(x))
        keepdims = bool(node.attr("keepdims", 1))
        if node.since < axes_input_from:
            chosen = node.attr("axes", None)
        else:
            chosen = None if axes is None else node.static_ints(axes, "axes")
            if not chosen and node.attr("noop_with_empty_axes", 0):
                return x
            chosen = chosen or None
        chosen = list(range(ndim)) if chosen is None else [axis_of(node, a, ndim)
                                                           for a in chosen]
        return fn(x, tuple(chosen), keepdims)


_reduce("ReduceSum", ops.sum, (1, 11, 13), 13)
_reduce("ReduceMean", ops.mean, (1, 11, 13), 18)
_reduce("ReduceMax", ops.max, (1, 11, 12, 13, 18), 18)
_reduce("ReduceLogSumExp", ops.logsumexp, (1, 11, 13, 18), 18)
_reduce("ReduceMin", ops.min, (1, 11, 12, 13, 18), 18)
_reduce("ReduceProd", ops.prod, (1, 11, 13, 18), 18)
_reduce("ReduceL1", lambda x, axes, keepdims: ops.norm(x, 1, axes, keepdims), (1, 11, 13, 18), 18)
_reduce("ReduceL2", lambda x, axes, keepdims: ops.norm(x, 2, axes, keepdims), (1, 11, 13, 18), 18)


def _arg_reduce(op_type: str, fn: Any) -> None:
    @converter(op_type, (1, 11, 12, 13), ("axis", "keepdims", "select_last_index"))
    def convert(node: NodeView, x: Any) -> Any:
        sx = shape(x)
        axis = axis_of(node, node.attr("axis", 0), len(sx))
        keepdims = bool(node.attr("keepdims", 1))
        if not node.attr("select_last_index", 0):
            return fn(x, axis, keepdims)
        # The last of ties: the first along the reversed axis, counted from the end.
        flipped = ops.getitem(x, (slice(None),) * axis + (slice(None, None, -1),))
        return ops.sub(sx[axis] - 1, fn(flipped, axis, keepdims))


_arg_reduce("ArgMax", ops.argmax)
_arg_reduce("ArgMin", ops.argmin)


@converter("GlobalAveragePool", (1,))
def _global_average_pool(node: NodeView, x: Any) -> Any:
    return ops.mean(x, tuple(range(2, len(shape(x)))), True)


@converter("GlobalMaxPool", (1,))
def _global_max_pool(node: NodeView, x: Any) -> Any:
    return ops.max(x, tuple(range(2, len(shape(x)))), True)


def _per_channel(v: Any, ndim: int) -> Any:
    """A (C,) parameter shaped to broadcast over (N, C, ...)."""
    return ops.reshape(v, (1, shape(v)[0]) + (1,) * (ndim - 2))


@converter("BatchNormalization", (6, 7, 9, 14, 15),
           ("epsilon", "momentum", "is_test", "spatial", "training_mode"),
           statistics_inputs=(3, 4))
def _batch_norm(node: NodeView, x: Any, scale: Any, bias: Any, mean: Any, var: Any) -> Any:
    if len([o for o in node.outputs if o]) > 1 or node.attr("training_mode", 0):
        raise OnnxImportError("training mode (running statistics as outputs) is not "
                              "implemented; only inference")
    if not node.attr("spatial", 1):
        raise OnnxImportError("spatial=0 (per-activation statistics) is not implemented")
    sx = shape(x)
    if len(sx) < 2 or any(shape(v) != (sx[1],) for v in (scale, bias, mean, var)):
        raise OnnxImportError(f"scale, B, mean and var must each have shape ({sx[1]},) for an "
                              f"input of shape {sx}")
    eps = node.attr("epsilon", 1e-5)
    # Fold into one scale and shift per channel: two ops on the activations, not four.
    factor = ops.div(scale, ops.sqrt(ops.add(var, np.asarray(eps, dtype(var)))))
    shift = ops.sub(bias, ops.mul(mean, factor))
    return ops.add(ops.mul(x, _per_channel(factor, len(sx))), _per_channel(shift, len(sx)))


@converter("InstanceNormalization", (6,), ("epsilon",))
def _instance_norm(node: NodeView, x: Any, scale: Any, bias: Any) -> Any:
    sx = shape(x)
    axes = tuple(range(2, len(sx)))
    if len(sx) < 3:
        raise OnnxImportError("the input needs at least 3 dimensions (N, C, D1, ...)")
    eps = node.attr("epsilon", 1e-5)
    centered = ops.sub(x, ops.mean(x, axes, True))
    var = ops.mean(ops.mul(centered, centered), axes, True)
    normalized = ops.div(centered, ops.sqrt(ops.add(var, np.asarray(eps, dtype(x)))))
    return ops.add(ops.mul(normalized, _per_channel(scale, len(sx))),
                   _per_channel(bias, len(sx)))


@converter("LayerNormalization", (17,), ("axis", "epsilon", "stash_type"))
def _layer_norm(node: NodeView, x: Any, scale: Any, bias: Any = None
                ) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    sx = shape(x)
    axis = axis_of(node, node.attr("axis", -1), len(sx))
    eps = node.attr("epsilon", 1e-5)
    if dtype(x).kind != "f" or dtype(scale) != dtype(x) or (bias is not None and
                                                            dtype(bias) != dtype(x)):
        raise OnnxImportError(f"X, Scale and B must share one floating dtype, not {dtype(x)}, "
                              f"{dtype(scale)}, {dtype(bias) if bias is not None else '-'}")
    stash = node.attr("stash_type", 1)
    if stash not in (1, 11):  # FLOAT, DOUBLE: the precision of the statistics
        raise OnnxImportError(f"stash_type {stash} is not implemented (1 float, 11 double are)")
    outputs = [o for o in node.outputs[1:] if o]
    fused = axis == len(sx) - 1 and bias is not None and shape(scale) == sx[-1:] and \
        shape(bias) == sx[-1:] and not outputs and np.dtype(dtype(x)) == (
            np.float32 if stash == 1 else np.float64)
    if fused:
        return ops.layer_norm(x, scale, bias, eps)
    # The spec's function body: statistics in the stash type, then back to X's type.
    work = np.float32 if stash == 1 else np.float64
    xs = ops.astype(x, work)
    axes = tuple(range(axis, len(sx)))
    mean = ops.mean(xs, axes, True)
    centered = ops.sub(xs, mean)
    inv_std = ops.div(np.ones((), work), ops.sqrt(ops.add(
        ops.mean(ops.mul(centered, centered), axes, True), np.asarray(eps, work))))
    y = ops.mul(ops.astype(ops.mul(centered, inv_std), dtype(x)), scale)
    if bias is not None:
        y = ops.add(y, bias)
    return y, mean, inv_std


@converter("LRN", (1, 13), ("alpha", "beta", "bias", "size"))
def _lrn(node: NodeView, x: Any) -> Any:
    sx = shape(x)
    size = node.attr("size")
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    if len(sx) < 3 or size < 1:
        raise OnnxImportError(f"needs an (N, C, ...) input and size >= 1, got size {size}")
    c = sx[1]
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    squares = ops.mul(x, x)
    zero = np.zeros((), dtype(x))  # broadcast views: the concatenation allocates
    parts = ([ops.broadcast_to(zero, (sx[0], before) + sx[2:])] if before else []) + \
        [squares] + ([ops.broadcast_to(zero, (sx[0], after) + sx[2:])] if after else [])
    padded = ops.concatenate(parts, 1) if len(parts) > 1 else squares
    # The window of channel i spans padded channels i .. i + size - 1.
    total = functools.reduce(ops.add, (ops.getitem(padded, (slice(None), slice(offset, offset + c)))
                                       for offset in range(size)))
    denominator = ops.pow(ops.add(ops.mul(total, alpha / size), np.asarray(bias, dtype(x))),
                          np.asarray(beta, dtype(x)))
    return ops.div(x, denominator)


@converter("Dropout", (6, 7, 10, 12, 13), ("ratio", "is_test", "seed"),
           static_inputs=(1, 2))
def _dropout(node: NodeView, x: Any, ratio: Any = None, training_mode: Any = None) -> Any:
    if training_mode is not None and bool(node.static(training_mode, "training_mode").item()):
        raise OnnxImportError("training_mode=True (random dropout) is not implemented; "
                              "inference only")
    if node.since < 7 and node.attr("is_test", 0) == 0 and len(node.outputs) > 1:
        raise OnnxImportError("is_test=0 with a mask output is training mode; inference only")
    wants_mask = len(node.outputs) > 1 and node.outputs[1]
    if not wants_mask:
        return x
    # In inference every element is kept: the mask is all ones (bool from opset 10).
    mask_dtype = np.bool_ if node.since >= 10 else dtype(x)
    return x, np.ones(shape(x), dtype=mask_dtype)


@converter("CumSum", (11, 14), ("exclusive", "reverse"), static_inputs=(1,))
def _cumsum(node: NodeView, x: Any, axis: Any) -> Any:
    chosen = node.static_ints(axis, "axis")
    if len(chosen) != 1 or not shape(x):
        raise OnnxImportError(f"CumSum node {node.name!r}: needs one axis of an input with "
                              f"dimensions, not axis {chosen} of shape {shape(x)}")
    a = axis_of(node, chosen[0], len(shape(x)))
    reverse = bool(node.attr("reverse", 0))
    summed = cumsum_p.bind(x, axis=a, reverse=reverse)
    if dtype(summed) != dtype(x):  # NumPy sums small ints as int64; ONNX keeps the type
        summed = ops.astype(summed, dtype(x))
    if not node.attr("exclusive", 0):
        return summed
    # Each exclusive sum leaves out its own element: the inclusive sums moved one place
    # along the axis, a zero entering where the sums start.
    before = (slice(None),) * a
    zero = np.zeros(shape(x)[:a] + (1,) + shape(x)[a + 1:], dtype(x))
    if reverse:
        return ops.concatenate([ops.getitem(summed, (*before, slice(1, None))), zero], axis=a)
    return ops.concatenate([zero, ops.getitem(summed, (*before, slice(0, -1)))], axis=a)
