"""How each primitive becomes ONNX nodes: an exporter per primitive, registered on the
primitive object (its `exporter` fact; the ops layer imports no ONNX), with the
emitter and per-equation context the exporters write through. A primitive without
one does not export; those that never will say why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ..lower.graph import Eqn, Var
from ..ops.attention import attention_p
from ..ops.batchnorm import batch_norm_p
from ..ops.conv import avg_pool2d_p, conv2d_p, fold2d_p, max_pool2d_p, unfold2d_p
from ..ops.elementwise import (
    abs_p,
    add_p,
    astype_p,
    clip_p,
    cos_p,
    div_p,
    equal_p,
    erf_p,
    exp_p,
    gelu_p,
    greater_equal_p,
    greater_p,
    less_equal_p,
    less_p,
    log_p,
    maximum_p,
    minimum_p,
    mul_p,
    neg_p,
    not_equal_p,
    pow_p,
    relu_p,
    sigmoid_p,
    sign_p,
    silu_p,
    sin_p,
    softplus_p,
    sqrt_p,
    sub_p,
    tanh_p,
    where_p,
)
from ..ops.gather import (
    take_along_axis_p,
    take_along_axis_scatter_add_p,
    take_p,
    take_scatter_add_p,
)
from ..ops.linalg import matmul_p
from ..ops.loss import cross_entropy_p, dropout_mask_p, one_hot_p
from ..ops.norm import layer_norm_p
from ..ops.reduce import (
    argmax_p,
    argmin_p,
    cumsum_p,
    log_softmax_p,
    logsumexp_p,
    reduce_max_p,
    reduce_min_p,
    reduce_prod_p,
    reduce_sum_p,
    softmax_p,
)
from ..ops.shape import (
    broadcast_to_p,
    concatenate_p,
    getitem_p,
    identity_p,
    pad2d_p,
    reshape_p,
    scatter_add_p,
    stop_gradient_p,
    sum_to_shape_p,
    transpose_p,
)
from ..ops.stats import norm_p


class ExportError(ValueError):
    """A model that cannot be written as ONNX; the message names the primitives."""


class Emitter:
    """Builds the ONNX graph: nodes, initializers and unique value names."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.used: set[str] = set()
        self._scalars: dict[tuple, str] = {}

    def fresh(self, hint: str) -> str:
        name, i = hint, 1
        while name in self.used:
            name, i = f"{hint}_{i}", i + 1
        self.used.add(name)
        return name

    def node(self, op_type: str, inputs: list[str], hint: str = "", **attrs: Any) -> str:
        out = self.fresh(hint or op_type.lower())
        self.nodes.append(self.helper.make_node(op_type, inputs, [out],
                                                name=self.fresh(f"{op_type}_{len(self.nodes)}"),
                                                **attrs))
        return out

    def const(self, array: Any, hint: str) -> str:
        array = np.asarray(array)
        name = self.fresh(hint)
        self.initializers.append(self.numpy_helper.from_array(np.ascontiguousarray(array)
                                                              if array.ndim else array, name))
        return name

    def scalar(self, value: Any, dtype: np.dtype) -> str:
        key = (type(value), value, np.dtype(dtype).str)
        if key not in self._scalars:
            self._scalars[key] = self.const(np.asarray(value, dtype=dtype), "scalar")
        return self._scalars[key]

    def ints(self, values: Any, hint: str) -> str:
        return self.const(np.asarray(list(values), dtype=np.int64), hint)


class Context:
    """What an exporter sees of one equation: its operands as ONNX names, its params."""

    def __init__(self, emit: Emitter, eqn: Eqn, names: dict[int, str]):
        self.emit, self.eqn, self.params = emit, eqn, eqn.params
        self.names = names  # every value's ONNX name, for parameters computed from inputs
        self.out = eqn.out
        float_dtype = next((a.dtype for a in eqn.args if isinstance(a, Var)), eqn.out.dtype)
        self.args = [names[a.index] if isinstance(a, Var) else
                     ("" if a is None else emit.scalar(a, float_dtype)) for a in eqn.args]
        self.vars = eqn.args

    def node(self, op_type: str, inputs: list[str] | None = None, **attrs: Any) -> str:
        return self.emit.node(op_type, self.args if inputs is None else inputs, **attrs)

    def scalar(self, value: Any) -> str:
        return self.emit.scalar(value, self.out.dtype)


Exporter = Callable[[Context], str]

# ---------------------------------------------------------------- the exporters


def _same(op_type: str) -> Exporter:
    return lambda c: c.node(op_type)


def _gelu(c: Context) -> str:
    (x,) = c.args
    half = c.node("Mul", [x, c.scalar(0.5)])
    if c.params["approximate"] == "tanh":
        cube = c.node("Mul", [c.node("Mul", [x, x]), x])
        inner = c.node("Add", [x, c.node("Mul", [cube, c.scalar(0.044715)])])
        core = c.node("Tanh", [c.node("Mul", [inner, c.scalar(float(np.sqrt(2 / np.pi)))])])
    else:
        core = c.node("Erf", [c.node("Mul", [x, c.scalar(float(1 / np.sqrt(2)))])])
    return c.node("Mul", [half, c.node("Add", [core, c.scalar(1.0)])])


def _reduce(op_type: str) -> Exporter:
    def export(c: Context) -> str:
        axes, keepdims = tuple(c.params["axes"]), int(bool(c.params["keepdims"]))
        if not axes:
            return c.node("Identity")
        if op_type == "ReduceSum":  # axes are an input from opset 13, an attribute before 18
            return c.node(op_type, [c.args[0], c.emit.ints(axes, "axes")], keepdims=keepdims)
        return c.node(op_type, axes=list(axes), keepdims=keepdims)

    return export


def _reshape(c: Context) -> str:
    shape = c.out.shape
    attrs = {"allowzero": 1} if 0 in shape else {}
    return c.node("Reshape", [c.args[0], c.emit.ints(shape, "shape")], **attrs)


def _transpose(c: Context) -> str:
    axes = c.params.get("axes")
    perm = list(axes) if axes is not None else list(range(len(c.vars[0].shape)))[::-1]
    return c.node("Transpose", perm=perm)


def _broadcast_to(c: Context) -> str:
    return c.node("Expand", [c.args[0], c.emit.ints(c.out.shape, "shape")])


def _sum_to_shape(c: Context) -> str:
    source, target = c.vars[0].shape, tuple(c.params["shape"])
    lead = len(source) - len(target)
    axes = list(range(lead)) + [lead + i for i, d in enumerate(target)
                                if d == 1 and source[lead + i] != 1]
    summed = c.node("ReduceSum", [c.args[0], c.emit.ints(axes, "axes")], keepdims=1) \
        if axes else c.args[0]
    return c.node("Reshape", [summed, c.emit.ints(target, "shape")])


def _getitem(c: Context) -> str:
    """Basic indexing (ints, slices with steps, Ellipsis, None) as one Slice and a Reshape;
    one integer-array index among slices as a Gather."""
    shape = c.vars[0].shape
    index = c.params["index"]
    index = index if isinstance(index, tuple) else (index,)
    real = [i for i in index if i is not None and i is not Ellipsis]
    if Ellipsis in index:
        at = index.index(Ellipsis)
        fill = (slice(None),) * (len(shape) - len(real))
        index = index[:at] + fill + index[at + 1:]
    entries = [i for i in index if i is not None]
    entries += [slice(None)] * (len(shape) - len(entries))
    arrays = [a for a, i in enumerate(entries) if isinstance(i, (np.ndarray, list, tuple))]
    if len(arrays) > 1 or (arrays and any(_is_int(i) for i in entries)) or any(
            isinstance(i, np.ndarray) and i.dtype.kind == "b" for i in entries):
        raise ExportError(f"getitem: index {c.params['index']!r} on {shape}: only ints, slices, "
                          "Ellipsis, None and one integer array among slices export")
    starts, ends, axes, steps = [], [], [], []
    for axis, (i, size) in enumerate(zip(entries, shape)):
        if _is_int(i):
            i = int(i) + (size if int(i) < 0 else 0)
            starts.append(i)
            ends.append(i + 1)
            axes.append(axis)
            steps.append(1)
        elif isinstance(i, slice) and i != slice(None):
            start, stop, step = i.indices(size)
            if step < 0 and stop < 0:
                stop = -size - 1  # "before the first element", as ONNX clamps it
            starts.append(start)
            ends.append(stop)
            axes.append(axis)
            steps.append(step)
    x = c.args[0]
    if axes:
        x = c.emit.node("Slice", [x, c.emit.ints(starts, "starts"), c.emit.ints(ends, "ends"),
                                  c.emit.ints(axes, "axes"), c.emit.ints(steps, "steps")])
    if arrays:
        (axis,) = arrays
        indices = np.asarray(entries[axis], dtype=np.int64)
        x = c.emit.node("Gather", [x, c.emit.const(indices, "indices")], axis=axis)
    target = c.emit.ints(c.out.shape, "shape")
    if 0 in c.out.shape:
        return c.emit.node("Reshape", [x, target], allowzero=1)
    return c.emit.node("Reshape", [x, target])


def _is_int(i: Any) -> bool:
    return isinstance(i, (int, np.integer)) and not isinstance(i, bool)


def _concatenate(c: Context) -> str:
    return c.node("Concat", axis=int(c.params["axis"]))


def _pad2d(c: Context) -> str:
    ph, pw = c.params["padding"]
    lead = [0] * (len(c.vars[0].shape) - 2)
    pads = lead + [ph, pw] + lead + [ph, pw]
    return c.node("Pad", [c.args[0], c.emit.ints(pads, "pads"), c.scalar(c.params["value"])],
                  mode="constant")


def _clip(c: Context) -> str:
    lo, hi = c.params["lo"], c.params["hi"]
    return c.node("Clip", [c.args[0], "" if lo is None else c.scalar(lo),
                           "" if hi is None else c.scalar(hi)])


def _astype(c: Context) -> str:
    return c.node("Cast", to=c.emit.helper.np_dtype_to_tensor_dtype(np.dtype(c.params["dtype"])))


def _silu(c: Context) -> str:
    return c.node("Mul", [c.args[0], c.node("Sigmoid")])


def _where(c: Context) -> str:
    # The condition is a parameter: a value computed from the inputs (a Var, traced as
    # plans trace it) or a constant mask.
    cond = c.params["cond"]
    name = c.names[cond.index] if isinstance(cond, Var) else c.emit.const(
        np.asarray(cond, dtype=bool), "condition")
    return c.node("Where", [name, *c.args])


def _not_equal(c: Context) -> str:
    return c.node("Not", [c.node("Equal")])


def _window(c: Context, kernel: tuple) -> dict:
    ph, pw = c.params["padding"]
    attrs = {"kernel_shape": list(kernel), "strides": list(c.params["stride"]),
             "pads": [ph, pw, ph, pw]}
    dilation = tuple(c.params.get("dilation", (1, 1)))
    if dilation != (1, 1):
        attrs["dilations"] = list(dilation)
    return attrs


def _conv2d(c: Context) -> str:
    attrs = _window(c, c.vars[1].shape[2:])
    attrs["group"] = int(c.params.get("groups", 1))
    return c.node("Conv", **attrs)


def _max_pool2d(c: Context) -> str:
    return c.node("MaxPool", **_window(c, c.params["kernel"]))


def _avg_pool2d(c: Context) -> str:
    return c.node("AveragePool", count_include_pad=1, **_window(c, c.params["kernel"]))


def _layer_norm(c: Context) -> str:
    return c.node("LayerNormalization", axis=-1, epsilon=float(c.params["eps"]))


def _batch_norm(c: Context) -> str:
    if c.params["training"]:
        raise ExportError("batch_norm: training mode (batch statistics) does not export; "
                          "export runs modules in eval mode, and pb.batch_norm exports with "
                          "training=False (running statistics)")
    x, mean, var, weight, bias = c.args
    channels, dtype = c.vars[0].shape[1], c.out.dtype
    # BatchNormalization takes a scale and a bias always: ones and zeros stand for none.
    weight = weight or c.emit.const(np.ones(channels, dtype), "ones")
    bias = bias or c.emit.const(np.zeros(channels, dtype), "zeros")
    return c.node("BatchNormalization", [x, weight, bias, mean, var],
                  epsilon=float(c.params["eps"]))


def _indices(c: Context) -> tuple[str, tuple]:
    """A gather's indices as an int64 ONNX value and their shape: the value the inputs
    give at each run (an embedding's token ids), or a constant."""
    indices = c.params["indices"]
    if isinstance(indices, Var):
        name = c.names[indices.index]
        if indices.dtype != np.int64:
            name = c.emit.node("Cast", [name], to=c.emit.helper.np_dtype_to_tensor_dtype(
                np.dtype(np.int64)))
        return name, indices.shape
    indices = np.asarray(indices, dtype=np.int64)
    return c.emit.const(indices, "indices"), indices.shape


def _take(c: Context) -> str:
    indices, _ = _indices(c)
    return c.node("Gather", [c.args[0], indices], axis=int(c.params["axis"]))


def _take_along_axis(c: Context) -> str:
    # GatherElements does not broadcast: indices and x are expanded to the result's shape
    # (x keeps its own length along the axis) where they were broadcast.
    axis, out = int(c.params["axis"]), tuple(c.out.shape)
    indices, shape = _indices(c)
    if tuple(shape) != out:
        indices = c.emit.node("Expand", [indices, c.emit.ints(out, "shape")])
    x, x_shape = c.args[0], tuple(c.vars[0].shape)
    spread = out[:axis] + (x_shape[axis],) + out[axis + 1:]
    if x_shape != spread:
        x = c.emit.node("Expand", [x, c.emit.ints(spread, "shape")])
    return c.node("GatherElements", [x, indices], axis=axis)


def _softmax(op_type: str) -> Exporter:
    return lambda c: c.node(op_type, axis=int(c.params["axis"]))


def _attention(c: Context) -> str:
    """scaled_dot_product_attention spelled out: MatMul, Softmax, Where for the causal
    mask and for rows the mask hides every key from (zeros, as the op gives them)."""
    q, k, v, bias, keep = c.args
    q_shape, k_shape = c.vars[0].shape, c.vars[1].shape
    rank = len(k_shape)
    key_t = c.node("Transpose", [k], perm=[*range(rank - 2), rank - 1, rank - 2])
    scores = c.node("MatMul", [c.node("Mul", [q, c.scalar(c.params["scale"])]), key_t])
    if c.params["causal"]:
        later = np.triu(np.ones((q_shape[-2], k_shape[-2]), dtype=bool), 1)
        scores = c.node("Where", [c.emit.const(later, "causal"), c.scalar(-np.inf), scores])
    dead = None
    if bias:
        scores = c.node("Add", [scores, bias])
        row_max = c.node("ReduceMax", [bias], axes=[-1], keepdims=1)
        dead = c.node("Equal", [row_max, c.scalar(-np.inf)])
    weights = c.node("Softmax", [scores], axis=-1)
    if dead:
        weights = c.node("Where", [dead, c.scalar(0.0), weights])
    if keep:
        weights = c.node("Mul", [weights, keep])
    return c.node("MatMul", [weights, v])


class _Mapping(NamedTuple):
    """What export registers on a primitive (its `exporter`): `write`, how it becomes
    ONNX nodes (None: it does not export, for `reason`), and `traced_params`, whether
    `write` takes parameters computed from the inputs (where's condition)."""

    write: Exporter | None
    reason: str = ""
    traced_params: bool = False


def _register(prims: tuple, write: Exporter | None, reason: str = "",
              traced_params: bool = False) -> None:
    for prim in prims:
        prim.exporter = _Mapping(write, reason, traced_params)


for _prims, _op_type in (
    ((add_p,), "Add"), ((sub_p,), "Sub"), ((mul_p,), "Mul"), ((div_p,), "Div"),
    ((pow_p,), "Pow"), ((maximum_p,), "Max"), ((minimum_p,), "Min"), ((neg_p,), "Neg"),
    ((sign_p,), "Sign"), ((exp_p,), "Exp"), ((log_p,), "Log"), ((sqrt_p,), "Sqrt"),
    ((abs_p,), "Abs"), ((relu_p,), "Relu"), ((sigmoid_p,), "Sigmoid"), ((tanh_p,), "Tanh"),
    ((erf_p,), "Erf"), ((softplus_p,), "Softplus"), ((less_p,), "Less"),
    ((less_equal_p,), "LessOrEqual"), ((greater_p,), "Greater"),
    ((greater_equal_p,), "GreaterOrEqual"), ((equal_p,), "Equal"), ((matmul_p,), "MatMul"),
    ((identity_p, stop_gradient_p), "Identity"),
):
    _register(_prims, _same(_op_type))
for _prims, _write in (
    ((silu_p,), _silu), ((gelu_p,), _gelu), ((not_equal_p,), _not_equal), ((clip_p,), _clip),
    ((astype_p,), _astype), ((reduce_sum_p,), _reduce("ReduceSum")),
    ((reduce_max_p,), _reduce("ReduceMax")), ((softmax_p,), _softmax("Softmax")),
    ((log_softmax_p,), _softmax("LogSoftmax")), ((reshape_p,), _reshape),
    ((transpose_p,), _transpose), ((broadcast_to_p,), _broadcast_to),
    ((sum_to_shape_p,), _sum_to_shape), ((getitem_p,), _getitem),
    ((concatenate_p,), _concatenate), ((pad2d_p,), _pad2d), ((conv2d_p,), _conv2d),
    ((max_pool2d_p,), _max_pool2d), ((avg_pool2d_p,), _avg_pool2d),
    ((layer_norm_p,), _layer_norm), ((batch_norm_p,), _batch_norm), ((attention_p,), _attention),
):
    _register(_prims, _write)
_register((where_p,), _where, traced_params=True)
_register((take_p,), _take, traced_params=True)
_register((take_along_axis_p,), _take_along_axis, traced_params=True)
# Primitives that do not export, and why (any other without a mapping: "no ONNX mapping").
_register((dropout_mask_p,), None, "random masks (a Dropout in training mode; export runs the "
          "module in eval mode, so something else draws them)")
_register((cross_entropy_p,), None, "a loss: export the model, not its training objective")
_register((one_hot_p,), None, "a loss's helper: export the model, not its training objective")
_register((unfold2d_p,), None, "im2col appears in derivatives, not in models")
_register((fold2d_p,), None, "col2im appears in derivatives, not in models")
_register((scatter_add_p, take_scatter_add_p, take_along_axis_scatter_add_p), None,
          "the transpose of indexing appears in derivatives, not in models")


def _cumsum(c: Context) -> str:
    axis = c.emit.const(np.asarray(int(c.params["axis"]), dtype=np.int64), "axis")
    return c.node("CumSum", [c.args[0], axis], reverse=int(bool(c.params["reverse"])))


_register((sin_p,), _same("Sin"))
_register((cos_p,), _same("Cos"))
_register((logsumexp_p,), _reduce("ReduceLogSumExp"))  # axes an attribute until opset 18
_register((cumsum_p,), _cumsum)


def _norm(c: Context) -> str:
    p, axes, keepdims = c.params["p"], list(c.params["axes"]), int(bool(c.params["keepdims"]))
    if not axes:  # a norm over no axis: the magnitude
        return c.node("Abs")
    if p in (1.0, 2.0):
        return c.node("ReduceL1" if p == 1.0 else "ReduceL2", axes=axes, keepdims=keepdims)
    powered = c.node("Pow", [c.node("Abs"), c.scalar(p)])
    total = c.node("ReduceSum", [powered, c.emit.ints(axes, "axes")], keepdims=keepdims)
    return c.node("Pow", [total, c.scalar(1.0 / p)])


def _arg_reduce(op_type: str) -> Exporter:
    def export(c: Context) -> str:
        axis, keepdims = c.params["axis"], bool(c.params["keepdims"])
        if axis is not None:
            return c.node(op_type, axis=int(axis), keepdims=int(keepdims))
        # Over every axis: the index into the flattened tensor, as NumPy and PyTorch give.
        flat = c.node("Reshape", [c.args[0], c.emit.ints((-1,), "shape")])
        index = c.node(op_type, [flat], axis=0, keepdims=0)
        return c.node("Reshape", [index, c.emit.ints(c.out.shape, "shape")])

    return export


_register((reduce_min_p,), _reduce("ReduceMin"))
_register((reduce_prod_p,), _reduce("ReduceProd"))
_register((norm_p,), _norm)
_register((argmax_p,), _arg_reduce("ArgMax"))
_register((argmin_p,), _arg_reduce("ArgMin"))


def exporter_of(eqn: Eqn) -> Exporter | None:
    mapping = eqn.primitive.exporter  # None for a custom op (its own primitive)
    if mapping is None or (eqn.param_vars and not mapping.traced_params):
        return None  # an index computed from the inputs: the exporters write constants
    return mapping.write


def describe_unexported(eqn: Eqn) -> str:
    operands = ", ".join(f"{a.shape} {a.dtype}" if isinstance(a, Var) else repr(a)
                         for a in eqn.args)
    custom = eqn.params.get("op")
    kind = f"custom op {type(custom).__name__}" if custom is not None else eqn.primitive.name
    mapping = eqn.primitive.exporter
    reason = (mapping.reason if mapping is not None else None) if custom is None else \
        "a CustomOp runs NumPy code ONNX cannot hold"
    if eqn.param_vars and custom is None and not (mapping and mapping.traced_params):
        reason = "a parameter (an index) computed from the inputs; only constant ones export"
    return f"{kind} ({operands} -> {eqn.out.shape} {eqn.out.dtype})" + \
        (f": {reason}" if reason else ": no ONNX mapping")
