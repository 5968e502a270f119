"""layer_norm: normalize over the last axis, then scale and shift, as one primitive.

Forward and backward run as the backend's fused ops (`FusedOps.layer_norm` and
`layer_norm_backward_of_input`: one Numba pass each on the CPU backends; on a backend without
them, their defaults in its forward ops); the JVP rules are written in primitives,
so forward mode and higher orders work as for every other op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..ad import defjvp, defvjp
from ..backend.backward_ops import BackwardOps
from ..backend.base import Backend
from ..backend.fused import fused_ops
from ..errors import KernelError
from .checks import declare_check, inputs, normal
from .elementwise import add, div, mul, sqrt, sub
from .hints import TensorLike
from .reduce import mean
from .registry import declare, dtype_of, is_float, shape_of
from .shape import broadcast_to

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["layer_norm"]


def _shape(x: Any, weight: Any, bias: Any, eps: float) -> tuple[Any, ...]:
    shape = shape_of(x)
    operands = (x, weight, bias)
    if not shape or not is_float(dtype_of(x)):
        raise KernelError("layer_norm", operands, "x must be floating, with a last axis to "
                          "normalize over")
    for name, v in (("weight", weight), ("bias", bias)):
        if shape_of(v) != shape[-1:] or dtype_of(v) != dtype_of(x):
            raise KernelError("layer_norm", operands, f"{name} must have shape "
                              f"({shape[-1]},) and x's dtype")
    return shape, dtype_of(x)


def _impl(backend: Backend, x: Any, weight: Any, bias: Any, eps: float) -> Any:
    _shape(x, weight, bias, eps)  # eager calls skip shape rules; these shapes must agree
    return fused_ops(backend).layer_norm(x, weight, bias, eps)[0]


layer_norm_p = declare("layer_norm", _impl, _shape, saves_inputs=True, aliasing="fresh")


def _normalized(x: Any, eps: float) -> tuple[Tensor, Tensor]:
    """(x - mean) * rstd and rstd, in primitives (for the JVP rules)."""
    centered = sub(x, mean(x, -1, True))
    rstd = div(1.0, sqrt(add(mean(mul(centered, centered), -1, True), eps)))
    return mul(centered, rstd), rstd


def _jvp_x(t: Any, out: Any, x: Any, weight: Any, bias: Any, eps: float) -> Any:
    # d xhat = rstd * (t - mean(t) - xhat * mean(t * xhat)).
    xhat, rstd = _normalized(x, eps)
    d = sub(sub(t, mean(t, -1, True)), mul(xhat, mean(mul(t, xhat), -1, True)))
    return mul(mul(d, rstd), weight)


def _jvp_weight(t: Any, out: Any, x: Any, weight: Any, bias: Any, eps: float) -> Any:
    return mul(_normalized(x, eps)[0], t)


def _jvp_bias(t: Any, out: Any, x: Any, weight: Any, bias: Any, eps: float) -> Any:
    return broadcast_to(t, shape_of(x))


defjvp(layer_norm_p, _jvp_x, _jvp_weight, _jvp_bias)


def _vjp(be: BackwardOps, g: Any, n: Any) -> tuple[Any, ...]:
    # mean and rstd are recomputed from x rather than kept (a primitive keeps one output,
    # and the layer's output is what the next op reads): on the CPU row by row, in the
    # pass that computes the gradients.
    x, weight, _ = n.inputs
    return fused_ops(be).layer_norm_backward_of_input(g, x, weight, n.params["eps"])


defvjp(layer_norm_p, _vjp)


def layer_norm(x: TensorLike, weight: TensorLike, bias: TensorLike, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis, as
    torch.nn.functional.layer_norm(x, (n,), weight, bias, eps)."""
    return layer_norm_p.bind(x, weight, bias, eps=float(eps))


# ---------------------------------------------------------------- samples for `pullback check`

declare_check(layer_norm_p, lambda x, w, b: (layer_norm(x, w, b), layer_norm(x, w, b, 0.1)),
              inputs(normal(2, 3, 5), normal(5), normal(5)))
