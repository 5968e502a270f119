"""The primitive set: each primitive's shape rule, forward, and derivative rules.

The functions here accept tensors, NumPy arrays and Python scalars and return
what the installed evaluator makes of them (tensors, under `pullback.tensor`).
`PRIMITIVES` maps each primitive's public name to its declaration.
"""

from ..ad import set_tangent_add
from .conv import avg_pool2d, conv2d, fold2d, max_pool2d, unfold2d
from .custom import CustomOp
from .elementwise import (
    abs,
    add,
    add_p,
    astype,
    clip,
    cos,
    div,
    equal,
    erf,
    exp,
    gelu,
    greater,
    greater_equal,
    less,
    less_equal,
    log,
    maximum,
    minimum,
    mul,
    neg,
    not_equal,
    pow,
    relu,
    sigmoid,
    sign,
    silu,
    sin,
    softplus,
    sqrt,
    sub,
    tanh,
    where,
)
from .kernel_op import KernelOp  # installs kernel pairs as ops on tensors
from .linalg import matmul
from .loss import cross_entropy, dropout_mask, one_hot
from .norm import layer_norm
from .reduce import cumsum, log_softmax, logsumexp, max, mean, softmax, sum
from .registry import PRIMITIVES, declare
from .shape import (
    broadcast_to,
    concatenate,
    getitem,
    pad2d,
    reshape,
    scatter_add,
    stack,
    sum_to_shape,
    swap_last,
    transpose,
)

set_tangent_add(add_p)

__all__ = [
    "PRIMITIVES",
    "CustomOp",
    "KernelOp",
    "abs",
    "add",
    "astype",
    "avg_pool2d",
    "broadcast_to",
    "clip",
    "concatenate",
    "conv2d",
    "cos",
    "cross_entropy",
    "cumsum",
    "declare",
    "div",
    "dropout_mask",
    "equal",
    "erf",
    "exp",
    "fold2d",
    "gelu",
    "getitem",
    "greater",
    "greater_equal",
    "layer_norm",
    "less",
    "less_equal",
    "log",
    "log_softmax",
    "logsumexp",
    "matmul",
    "max",
    "max_pool2d",
    "maximum",
    "mean",
    "minimum",
    "mul",
    "neg",
    "not_equal",
    "one_hot",
    "pad2d",
    "pow",
    "relu",
    "reshape",
    "scatter_add",
    "sigmoid",
    "sign",
    "silu",
    "sin",
    "softmax",
    "softplus",
    "sqrt",
    "stack",
    "sub",
    "sum",
    "sum_to_shape",
    "swap_last",
    "tanh",
    "transpose",
    "unfold2d",
    "where",
]
