"""Tensors, eager recording, and the transforms over them."""

from ..ops.attention import draw_from
from .arrays import bool_, float32, float64, int32, int64
from .checkpoint import checkpoint
from .creation import (
    arange,
    default_generator,
    from_dlpack,
    from_numpy,
    full,
    manual_seed,
    multinomial,
    ones,
    ones_like,
    rand,
    randint,
    randn,
    tensor,
    zeros,
    zeros_like,
)
from .eager import Tensor
from .state import enable_grad, is_grad_enabled, no_grad
from .transforms import grad, jvp, linear_transpose, linearize, value_and_grad, vjp

# Attention's dropout draws from the global generator unless told otherwise.
draw_from(default_generator)

__all__ = [
    "Tensor",
    "arange",
    "bool_",
    "checkpoint",
    "enable_grad",
    "float32",
    "float64",
    "from_dlpack",
    "from_numpy",
    "full",
    "grad",
    "int32",
    "int64",
    "is_grad_enabled",
    "jvp",
    "linear_transpose",
    "linearize",
    "manual_seed",
    "multinomial",
    "no_grad",
    "ones",
    "ones_like",
    "rand",
    "randint",
    "randn",
    "tensor",
    "value_and_grad",
    "vjp",
    "zeros",
    "zeros_like",
]
