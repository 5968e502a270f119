"""pullback: a deep-learning engine built around the backward pass.

`import pullback as pb` gives tensors, ops, transforms (grad, vjp, jvp,
linearize, linear_transpose, checkpoint), gradient checking and the backends.
"""

from . import nn, ops, optim
from .backend import Backend, BackwardOps, CpuBackend, ThreadedCpuBackend
from .backend.current import get_backend, set_backend, use_backend
from .check import GradcheckError, gradcheck
from .errors import KernelError, TracingError
from .io import load, save
from .lower import LoweringMode, compile
from .ops import *  # noqa: F403  (each op's declaration module names it: ops.__all__)
from .ops.hints import ArrayLike, DTypeLike, TensorLike
from .tensor import (
    Tensor,
    arange,
    bool_,
    checkpoint,
    enable_grad,
    float32,
    float64,
    from_dlpack,
    from_numpy,
    full,
    grad,
    int32,
    int64,
    is_grad_enabled,
    jvp,
    linear_transpose,
    linearize,
    manual_seed,
    multinomial,
    no_grad,
    ones,
    ones_like,
    rand,
    randint,
    randn,
    tensor,
    value_and_grad,
    vjp,
    zeros,
    zeros_like,
)

# The package's one version: pyproject.toml reads it from here.
__version__ = "0.1.0"

__all__ = [
    "ArrayLike",
    "Backend",
    "BackwardOps",
    "CpuBackend",
    "DTypeLike",
    "GradcheckError",
    "KernelError",
    "LoweringMode",
    "Tensor",
    "TensorLike",
    "ThreadedCpuBackend",
    "TracingError",
    "__version__",
    "arange",
    "bool_",
    "checkpoint",
    "compile",
    "enable_grad",
    "float32",
    "float64",
    "from_dlpack",
    "from_numpy",
    "full",
    "get_backend",
    "grad",
    "gradcheck",
    "int32",
    "int64",
    "is_grad_enabled",
    "jvp",
    "linear_transpose",
    "linearize",
    "load",
    "manual_seed",
    "multinomial",
    "nn",
    "no_grad",
    "ones",
    "ones_like",
    "optim",
    "rand",
    "randint",
    "randn",
    "save",
    "set_backend",
    "tensor",
    "use_backend",
    "value_and_grad",
    "vjp",
    "zeros",
    "zeros_like",
]
__all__ += ops.__all__
