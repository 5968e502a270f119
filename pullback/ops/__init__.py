"""The primitive set: each primitive's shape rule, forward, and derivative rules.

The functions here accept tensors, NumPy arrays and Python scalars and return
what the installed evaluator makes of them (tensors, under `pullback.tensor`).
`PRIMITIVES` maps each primitive's public name to its declaration.

The ops come from their declaration modules: each module's `__all__` names the
ones `import pullback as pb` offers as `pb.<name>`, and this package's `__all__`
gathers them; type checkers read the same names from the literal list below (a test
says when a new public op is missing there). The building blocks the
layers above call as `ops.<name>` (indexing, folds, the loss primitives) are
re-exported by name below but are not `pb`'s.
"""

# The literal `__all__` below names what the star imports bring.
# ruff: noqa: F405

from typing import TYPE_CHECKING

from ..ad import set_tangent_add
from . import (
    attention,
    batchnorm,
    contraction,
    conv,
    custom,
    elementwise,
    gather,
    linalg,
    loss,
    masks,
    reduce,
    shape,
    sorting,
    stats,
    views,
)
from . import norm as layer_norm_module  # `ops.norm` is the vector norm (stats.norm)
from .attention import *  # noqa: F403
from .batchnorm import *  # noqa: F403
from .contraction import *  # noqa: F403
from .conv import *  # noqa: F403
from .conv import fold2d as fold2d
from .conv import unfold2d as unfold2d
from .custom import *  # noqa: F403
from .elementwise import *  # noqa: F403
from .elementwise import add_p
from .elementwise import astype as astype
from .elementwise import erf as erf
from .elementwise import sign as sign
from .gather import *  # noqa: F403
from .gather import take_along_axis_scatter_add as take_along_axis_scatter_add
from .gather import take_scatter_add as take_scatter_add
from .kernel_op import KernelOp as KernelOp  # installs kernel pairs as ops on tensors
from .linalg import *  # noqa: F403
from .loss import *  # noqa: F403
from .loss import cross_entropy as cross_entropy
from .loss import dropout_mask as dropout_mask
from .loss import one_hot as one_hot
from .masks import *  # noqa: F403
from .norm import *  # noqa: F403
from .recurrent import gru_sequence as gru_sequence
from .recurrent import lstm_sequence as lstm_sequence
from .reduce import *  # noqa: F403
from .registry import PRIMITIVES as PRIMITIVES
from .registry import declare as declare
from .shape import *  # noqa: F403
from .shape import getitem as getitem
from .shape import pad2d as pad2d
from .shape import scatter_add as scatter_add
from .shape import sum_to_shape as sum_to_shape
from .shape import swap_last as swap_last
from .sorting import *  # noqa: F403
from .stats import *  # noqa: F403
from .views import *  # noqa: F403

set_tangent_add(add_p)

if TYPE_CHECKING:
    # The same names spelled out for type checkers, which read only a literal `__all__`
    # (without it `from .ops import *` would give `pb` none of them); a test
    # (tests/ops/test_static_exports.py) keeps the two lists equal.
    __all__ = [
        "CustomOp",
        "abs",
        "add",
        "all",
        "any",
        "argmax",
        "argmin",
        "argsort",
        "avg_pool2d",
        "batch_norm",
        "broadcast_to",
        "chunk",
        "clip",
        "concatenate",
        "conv2d",
        "cos",
        "cumsum",
        "div",
        "einsum",
        "equal",
        "erf",
        "exp",
        "flatten",
        "gelu",
        "greater",
        "greater_equal",
        "layer_norm",
        "less",
        "less_equal",
        "log",
        "log_softmax",
        "logsumexp",
        "masked_fill",
        "matmul",
        "max",
        "max_pool2d",
        "maximum",
        "mean",
        "min",
        "minimum",
        "mul",
        "neg",
        "norm",
        "not_equal",
        "one_hot",
        "permute",
        "pow",
        "prod",
        "relu",
        "reshape",
        "scaled_dot_product_attention",
        "sigmoid",
        "sign",
        "silu",
        "sin",
        "softmax",
        "softplus",
        "sort",
        "split",
        "sqrt",
        "squeeze",
        "stack",
        "std",
        "sub",
        "sum",
        "take",
        "take_along_axis",
        "tanh",
        "topk",
        "transpose",
        "tril",
        "triu",
        "unbind",
        "unsqueeze",
        "var",
        "where"
    ]
else:
    # A sum of the modules' lists (not a comprehension) so that documentation tools
    # reading the source statically (griffe, behind mkdocstrings) see which names `pb`
    # offers.
    __all__ = (
        attention.__all__
        + batchnorm.__all__
        + contraction.__all__
        + conv.__all__
        + custom.__all__
        + elementwise.__all__
        + gather.__all__
        + layer_norm_module.__all__
        + linalg.__all__
        + loss.__all__
        + masks.__all__
        + reduce.__all__
        + shape.__all__
        + sorting.__all__
        + stats.__all__
        + views.__all__
    )
