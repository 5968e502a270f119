"""Elementwise primitives: each declared once with its forward, JVP or transpose
rule and fused backward side by side.

Binary ops broadcast as NumPy does; their cotangents are summed back to each
operand's shape by `sum_to_shape`, the one place that undoes broadcasting.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ad import LinearVar, Primitive, Zero, defbilinear, defjvp, defjvp_full, deflinear, defvjp
from ..backend.base import check_gelu_mode
from ..errors import KernelError
from ..kernels import scalar_math
from .backward_defaults import backward_kernel
from .checks import (
    constant,
    declare_check,
    distinct,
    inputs,
    nonzero,
    normal,
    positive,
    separated,
)
from .hints import DTypeLike, Shape, TensorLike
from .registry import (
    Fusion,
    broadcast_shapes,
    declare,
    dtype_of,
    elementwise_rule,
    is_float,
    result_dtype,
    shape_of,
    tensor_method,
    writes_cotangent_into,
)
from .shape import broadcast_to, is_tensor, sum_to_shape

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = [
    "abs",
    "add",
    "clip",
    "cos",
    "div",
    "equal",
    "erf",
    "exp",
    "gelu",
    "greater",
    "greater_equal",
    "less",
    "less_equal",
    "log",
    "maximum",
    "minimum",
    "mul",
    "neg",
    "not_equal",
    "pow",
    "relu",
    "sigmoid",
    "sign",
    "silu",
    "sin",
    "softplus",
    "sqrt",
    "sub",
    "tanh",
    "where",
]


def _same(x: Any, **params: Any) -> tuple[Shape, Any]:
    return shape_of(x), dtype_of(x)


def _needed(node: Any) -> tuple[bool, bool]:
    a, b = node.parents
    return a is not None, b is not None


# ---------------------------------------------------------------- binary arithmetic


def _binary_impl(name: str) -> Callable[..., Any]:
    def impl(backend: Any, a: Any, b: Any) -> Any:
        out = getattr(backend, name)(a, b)
        dtype = out.dtype
        # Identity first: the common case costs two attribute reads.
        if getattr(a, "dtype", dtype) is not dtype or getattr(b, "dtype", dtype) is not dtype:
            return _mixed_dtypes(backend, name, a, b, out)
        return out

    return impl


def _mixed_dtypes(backend: Any, name: str, a: Any, b: Any, out: Any) -> Any:
    """Integer or bool operands take the floating operand's dtype; two floats must agree.
    A NumPy scalar acts as the Python scalar it equals (NumPy would promote by its type)."""
    if isinstance(a, np.generic) or isinstance(b, np.generic):
        a = a.item() if isinstance(a, np.generic) else a
        b = b.item() if isinstance(b, np.generic) else b
        out = getattr(backend, name)(a, b)
    dtype = result_dtype(name, a, b)
    if dtype is None or out.dtype == dtype or not is_float(dtype):
        return out  # equal dtypes that were not the same object, or no float involved
    cast = [backend.astype(x, dtype) if hasattr(x, "dtype") and x.dtype != dtype else x
            for x in (a, b)]
    return getattr(backend, name)(*cast)


add_p = declare("add", _binary_impl("add"), elementwise_rule("add"),
                aliasing="fresh", fusion=Fusion("{0} + {1}"))


def add(a: TensorLike, b: TensorLike) -> Tensor:
    return add_p.bind(a, b)


def _add_jvp(tangents: tuple[Any, ...], output: Any, inputs: tuple[Any, ...]) -> Any:
    ta, tb = tangents
    if type(tb) is Zero:
        return broadcast_to(ta, broadcast_shapes("add", ta, tb))
    if type(ta) is Zero:
        return broadcast_to(tb, broadcast_shapes("add", ta, tb))
    return add(ta, tb)


defjvp_full(add_p, _add_jvp)
deflinear(
    add_p,
    lambda ct, a, b: (
        sum_to_shape(ct, a.shape) if type(a) is LinearVar else None,
        sum_to_shape(ct, b.shape) if type(b) is LinearVar else None,
    ),
    linear_args=(0, 1),
)
defvjp(add_p, lambda be, g, n: be.add_backward(g, n.in_shapes[0], n.in_shapes[1], _needed(n)))

sub_p = declare("sub", _binary_impl("sub"), elementwise_rule("sub"),
                aliasing="fresh", fusion=Fusion("{0} - {1}"))


def sub(a: TensorLike, b: TensorLike) -> Tensor:
    return sub_p.bind(a, b)


def _sub_jvp(tangents: tuple[Any, ...], output: Any, inputs: tuple[Any, ...]) -> Any:
    ta, tb = tangents
    if type(tb) is Zero:
        return broadcast_to(ta, broadcast_shapes("sub", ta, tb))
    if type(ta) is Zero:
        return broadcast_to(neg(tb), broadcast_shapes("sub", ta, tb))
    return sub(ta, tb)


defjvp_full(sub_p, _sub_jvp)
deflinear(
    sub_p,
    lambda ct, a, b: (
        sum_to_shape(ct, a.shape) if type(a) is LinearVar else None,
        sum_to_shape(neg(ct), b.shape) if type(b) is LinearVar else None,
    ),
    linear_args=(0, 1),
)
defvjp(sub_p, lambda be, g, n: be.sub_backward(g, n.in_shapes[0], n.in_shapes[1], _needed(n)))

mul_p = declare("mul", _binary_impl("mul"), elementwise_rule("mul"),
                aliasing="fresh", fusion=Fusion("{0} * {1}"))


def mul(a: TensorLike, b: TensorLike) -> Tensor:
    return mul_p.bind(a, b)


defbilinear(
    mul_p,
    lambda ct, a, b: sum_to_shape(mul(ct, b), a.shape),
    lambda ct, a, b: sum_to_shape(mul(a, ct), b.shape),
)
def _mul_vjp(be: Any, g: Any, n: Any) -> tuple[Any, Any]:
    a, b = n.inputs
    if a is None:  # only the lhs is active, and only the rhs was saved
        return be.sum_to_shape(be.mul(g, b), n.in_shapes[0]), None
    if b is None:
        return None, be.sum_to_shape(be.mul(g, a), n.in_shapes[1])
    return be.mul_backward(g, a, b)


defvjp(mul_p, _mul_vjp)

div_p = declare("div", _binary_impl("div"), elementwise_rule("div"), saves_inputs=True,
                aliasing="fresh", fusion=Fusion("{0} / {1}"))


def div(a: TensorLike, b: TensorLike) -> Tensor:
    return div_p.bind(a, b)


defjvp(
    div_p,
    lambda t, out, a, b: div(t, b),
    lambda t, out, a, b: neg(div(mul(t, a), mul(b, b))),
)
# div is linear in its numerator: a tangent may be divided by a constant.
div_p.transpose = lambda ct, a, b: (sum_to_shape(div(ct, b), a.shape), None)
div_p.linear_args = frozenset((0,))
defvjp(div_p, lambda be, g, n: be.div_backward(g, *n.inputs, needed=_needed(n)))

pow_p = declare("pow", _binary_impl("pow"), elementwise_rule("pow"), saves_inputs=True,
                saves_output=True, aliasing="fresh")


def pow(a: TensorLike, b: TensorLike) -> Tensor:
    return pow_p.bind(a, b)


def _pow_jvp_base(t: Any, out: Any, a: Any, b: Any) -> Any:
    if isinstance(b, (int, float)):
        return mul(t, mul(pow(a, b - 1), b)) if b != 0 else mul(t, 0.0)
    return mul(t, mul(b, pow(a, sub(b, 1.0))))


def _pow_jvp_exponent(t: Any, out: Any, a: Any, b: Any) -> Any:
    # d/db a**b = a**b * log(a), as PyTorch and JAX give it: NaN for a negative base (its
    # log is not real), and at a zero base 0 for b >= 0 (0**b is flat there) and -inf
    # for b < 0.
    # The zero-base values are constants, so no derivative is taken through an infinity
    # (a where's unused branch times zero would be NaN in the second derivative).
    if isinstance(a, (int, float)):  # a Python base keeps the exponent's dtype
        if a != 0:
            return mul(t, mul(out, math.log(a) if a > 0 else math.nan))
        return mul(t, _pow_at_zero_base(b, out))
    zero = equal(a, 0.0)
    at_zero = _pow_at_zero_base(b, out)
    return mul(t, where(zero, at_zero, mul(out, log(where(zero, 1.0, a)))))


def _pow_at_zero_base(b: Any, out: Any) -> Any:
    # Two Python scalars would make a float64 where; the result takes the output's dtype.
    return astype(where(greater_equal(b, 0.0), 0.0, -math.inf), dtype_of(out))


defjvp(pow_p, _pow_jvp_base, _pow_jvp_exponent)


def _extremum(name: str, pick: Callable[[Any, Any], Any]) -> Primitive:
    prim = declare(name, _binary_impl(name), elementwise_rule(name), saves_inputs=True,
                   aliasing="fresh")

    def share(a: Any, b: Any) -> Any:
        # 1 where a wins, 0 where b wins, 1/2 on ties (as PyTorch splits them).
        return add(astype(pick(a, b), dtype_of(a) or dtype_of(b)),
                   mul(astype(equal(a, b), dtype_of(a) or dtype_of(b)), 0.5))

    defjvp(
        prim,
        lambda t, out, a, b: mul(t, share(a, b)),
        lambda t, out, a, b: mul(t, share(b, a)),
    )
    return prim


maximum_p = _extremum("maximum", lambda a, b: greater(a, b))
minimum_p = _extremum("minimum", lambda a, b: less(a, b))
defvjp(maximum_p, lambda be, g, n: be.maximum_backward(g, *n.inputs, needed=_needed(n)))
defvjp(minimum_p, lambda be, g, n: be.minimum_backward(g, *n.inputs, needed=_needed(n)))


@tensor_method(maximum_p)
def maximum(a: TensorLike, b: TensorLike) -> Tensor:
    return maximum_p.bind(a, b)


@tensor_method(minimum_p)
def minimum(a: TensorLike, b: TensorLike) -> Tensor:
    return minimum_p.bind(a, b)


# ---------------------------------------------------------------- comparisons (no gradient)


def _comparison(name: str) -> Primitive:
    def rule(a: Any, b: Any) -> tuple[Shape, str]:
        result_dtype(name, a, b)
        return broadcast_shapes(name, a, b), "bool"

    return declare(name, lambda backend, a, b: getattr(backend, name)(a, b), rule,
                   differentiable=False, aliasing="fresh")


less_p = _comparison("less")
less_equal_p = _comparison("less_equal")
greater_p = _comparison("greater")
greater_equal_p = _comparison("greater_equal")
equal_p = _comparison("equal")
not_equal_p = _comparison("not_equal")


def less(a: TensorLike, b: TensorLike) -> Tensor:
    return less_p.bind(a, b)


def less_equal(a: TensorLike, b: TensorLike) -> Tensor:
    return less_equal_p.bind(a, b)


def greater(a: TensorLike, b: TensorLike) -> Tensor:
    return greater_p.bind(a, b)


def greater_equal(a: TensorLike, b: TensorLike) -> Tensor:
    return greater_equal_p.bind(a, b)


def equal(a: TensorLike, b: TensorLike) -> Tensor:
    return equal_p.bind(a, b)


def not_equal(a: TensorLike, b: TensorLike) -> Tensor:
    return not_equal_p.bind(a, b)

# ---------------------------------------------------------------- unary


def _unary(name: str, fusion: Fusion | None = None, **saves: bool) -> Primitive:
    return declare(name, lambda backend, x: getattr(backend, name)(x), _same, **saves,
                   aliasing="fresh", fusion=fusion)


neg_p = _unary("neg", Fusion("-{0}"))


def neg(x: TensorLike) -> Tensor:
    return neg_p.bind1(x)


# Made a method after its def, not by a decorator, as are exp, sigmoid, sin and cos: rules
# above their defs call them, and mypy cannot type a decorated function used before its
# def in an import cycle (ops and tensor are one, for type checkers).
tensor_method(neg_p)(neg)


deflinear(neg_p, lambda ct, x: (neg(ct),))

sign_p = declare("sign", lambda backend, x: backend.sign(x), _same, differentiable=False,
                 aliasing="fresh")


def sign(x: TensorLike) -> Tensor:
    """-1, 0 or 1 elementwise; its derivative is zero almost everywhere, so it records nothing."""
    return sign_p.bind(x)


exp_p = _unary("exp", Fusion("exp({0})", {"exp": scalar_math.exp}), saves_output=True)
defjvp(exp_p, lambda t, out, x: mul(t, out))
defvjp(exp_p, lambda be, g, n: (be.exp_backward(g, n.output),))
backward_kernel(exp_p, "exp_backward", symmetric=True)

log_p = _unary("log", saves_inputs=True)
defjvp(log_p, lambda t, out, x: div(t, x))
defvjp(log_p, lambda be, g, n: (be.log_backward(g, n.inputs[0]),))
backward_kernel(log_p, "log_backward", symmetric=True)

sqrt_p = _unary("sqrt", saves_output=True)
defjvp(sqrt_p, lambda t, out, x: div(t, mul(out, 2.0)))
defvjp(sqrt_p, lambda be, g, n: (be.sqrt_backward(g, n.output),))
backward_kernel(sqrt_p, "sqrt_backward", symmetric=True)

abs_p = _unary("abs", saves_inputs=True)
defjvp(abs_p, lambda t, out, x: mul(t, sign(x)))
defvjp(abs_p, lambda be, g, n: (be.abs_backward(g, n.inputs[0]),))
backward_kernel(abs_p, "abs_backward", symmetric=True)

# relu(x) > 0 exactly where x > 0 (NaN included), so relu keeps its output, not its
# input, and hands it to relu_backward as the input's stand-in: the input (a bias
# add's result, say) is then free as soon as relu has run, and the two can be fused.
relu_p = _unary("relu", Fusion("0.0 if {0} <= 0.0 else {0}"),  # NaN stays NaN, as np.maximum
                saves_output=True)
defjvp(relu_p, lambda t, out, x: mul(t, greater(out, 0.0)))
defvjp(relu_p, lambda be, g, n: (be.relu_backward(g, n.output),))
backward_kernel(relu_p, "relu_backward", symmetric=True)
# Its cotangent buffer is laid out as its output, which its backward reads beside it.
writes_cotangent_into(
    relu_p, lambda args, first, by_columns, first_by_columns: "F" if by_columns else "C",
    lambda be, g, n, out: (be.relu_backward(g, n.output, out=out),))

sigmoid_p = _unary("sigmoid", Fusion("sigmoid({0})", {"sigmoid": scalar_math.sigmoid}),
                   saves_output=True)
defjvp(sigmoid_p, lambda t, out, x: mul(t, mul(out, sub(1.0, out))))
defvjp(sigmoid_p, lambda be, g, n: (be.sigmoid_backward(g, n.output),))
backward_kernel(sigmoid_p, "sigmoid_backward", symmetric=True)

tanh_p = _unary("tanh", Fusion("tanh({0})", {"tanh": scalar_math.tanh}), saves_output=True)
defjvp(tanh_p, lambda t, out, x: mul(t, sub(1.0, mul(out, out))))
defvjp(tanh_p, lambda be, g, n: (be.tanh_backward(g, n.output),))
backward_kernel(tanh_p, "tanh_backward", symmetric=True)


def _silu_derivative(x: Any) -> Any:
    s = sigmoid(x)
    return mul(s, add(1.0, mul(x, sub(1.0, s))))


silu_p = _unary("silu", saves_inputs=True)
defjvp(silu_p, lambda t, out, x: mul(t, _silu_derivative(x)))
defvjp(silu_p, lambda be, g, n: (be.silu_backward(g, n.inputs[0]),))
backward_kernel(silu_p, "silu_backward", symmetric=True)

softplus_p = _unary("softplus", saves_inputs=True)
defjvp(softplus_p, lambda t, out, x: mul(t, sigmoid(x)))
defvjp(softplus_p, lambda be, g, n: (be.softplus_backward(g, n.inputs[0]),))
backward_kernel(softplus_p, "softplus_backward", symmetric=True)

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
erf_p = _unary("erf", saves_inputs=True)
defjvp(erf_p, lambda t, out, x: mul(t, mul(exp(neg(mul(x, x))), _TWO_OVER_SQRT_PI)))

_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def _gelu_derivative(x: Any, approximate: str) -> Any:
    if approximate == "tanh":
        inner = mul(add(x, mul(mul(mul(x, x), x), _GELU_CUBIC)), _SQRT_2_OVER_PI)
        th = tanh(inner)
        d_inner = mul(add(1.0, mul(mul(x, x), 3.0 * _GELU_CUBIC)), _SQRT_2_OVER_PI)
        return add(mul(add(1.0, th), 0.5), mul(mul(mul(x, 0.5), sub(1.0, mul(th, th))), d_inner))
    cdf = mul(add(erf(mul(x, _INV_SQRT_2)), 1.0), 0.5)
    pdf = mul(exp(mul(mul(x, x), -0.5)), _INV_SQRT_2PI)
    return add(cdf, mul(x, pdf))


def _gelu_shape(x: Any, approximate: str) -> tuple[Shape, Any]:
    check_gelu_mode("gelu", [x], approximate)
    return _same(x)


gelu_p = declare("gelu", lambda backend, x, approximate: backend.gelu(x, approximate),
                 _gelu_shape, saves_inputs=True, aliasing="fresh")
defjvp(gelu_p, lambda t, out, x, approximate: mul(t, _gelu_derivative(x, approximate)))
defvjp(gelu_p, lambda be, g, n: (be.gelu_backward(g, n.inputs[0], n.params["approximate"]),))
backward_kernel(gelu_p, "gelu_backward", symmetric=True)


def exp(x: TensorLike) -> Tensor:
    return exp_p.bind1(x)


tensor_method(exp_p)(exp)


@tensor_method(log_p)
def log(x: TensorLike) -> Tensor:
    return log_p.bind1(x)


@tensor_method(sqrt_p)
def sqrt(x: TensorLike) -> Tensor:
    return sqrt_p.bind1(x)


@tensor_method(abs_p)
def abs(x: TensorLike) -> Tensor:
    return abs_p.bind1(x)


@tensor_method(relu_p)
def relu(x: TensorLike) -> Tensor:
    return relu_p.bind1(x)


def sigmoid(x: TensorLike) -> Tensor:
    return sigmoid_p.bind1(x)


tensor_method(sigmoid_p)(sigmoid)


@tensor_method(tanh_p)
def tanh(x: TensorLike) -> Tensor:
    return tanh_p.bind1(x)


@tensor_method(silu_p)
def silu(x: TensorLike) -> Tensor:
    return silu_p.bind1(x)


@tensor_method(softplus_p)
def softplus(x: TensorLike) -> Tensor:
    return softplus_p.bind1(x)


def erf(x: TensorLike) -> Tensor:
    return erf_p.bind1(x)


@tensor_method(gelu_p)
def gelu(x: TensorLike, approximate: str = "none") -> Tensor:
    return gelu_p.bind(x, approximate=approximate)


# ---------------------------------------------------------------- selection and casts


def _where_shape(a: Any, b: Any, cond: Any) -> tuple[Shape, Any]:
    return broadcast_shapes("where", cond, a, b), result_dtype("where", a, b)


# The condition is a parameter, not an operand: it is never differentiated.
def _where_impl(backend: Any, a: Any, b: Any, cond: Any) -> Any:
    out = backend.where(cond, a, b)
    dtype = out.dtype
    if getattr(a, "dtype", dtype) is not dtype or getattr(b, "dtype", dtype) is not dtype:
        dtype = result_dtype("where", a, b)  # raises for two floating dtypes
        if dtype is not None and dtype != out.dtype:
            out = backend.astype(out, dtype)
    return out


where_p = declare("where", _where_impl, _where_shape, aliasing="fresh")
where_p.masks_keep_shape = True  # the condition selects; the operands give the shape


def where(cond: TensorLike, a: TensorLike, b: TensorLike) -> Tensor:
    cond = getattr(cond, "_data", cond)
    if isinstance(cond, (list, tuple)):
        cond = np.asarray(cond)
    if not isinstance(cond, bool) and str(getattr(cond, "dtype", type(cond).__name__)) != "bool":
        # NumPy would read any nonzero value as true; PyTorch refuses, and so do we.
        raise KernelError("where", (cond, a, b), "the condition must be a bool tensor "
                          "(a comparison such as x > 0 makes one)")
    return where_p.bind(a, b, cond=cond)


def _where_jvp(tangents: tuple[Any, ...], output: Any, inputs: tuple[Any, ...],
               cond: Any) -> Any:
    ta, tb = tangents
    ta = 0.0 if type(ta) is Zero else ta
    tb = 0.0 if type(tb) is Zero else tb
    return where_p.bind(ta, tb, cond=cond)


defjvp_full(where_p, _where_jvp)
deflinear(
    where_p,
    lambda ct, a, b, cond: (
        sum_to_shape(where_p.bind(ct, 0.0, cond=cond), a.shape) if type(a) is LinearVar else None,
        sum_to_shape(where_p.bind(0.0, ct, cond=cond), b.shape) if type(b) is LinearVar else None,
    ),
    linear_args=(0, 1),
)


def _clip_shape(x: Any, lo: float | None, hi: float | None) -> tuple[Shape, Any]:
    return _same(x)


clip_p = declare("clip", lambda backend, x, lo, hi: backend.clip(x, lo, hi), _clip_shape,
                 saves_inputs=True, aliasing="fresh")


def _clip_mask(x: Any, lo: float | None, hi: float | None) -> Any:
    inside = None
    if lo is not None:
        inside = greater_equal(x, lo)
    if hi is not None:
        upper = less_equal(x, hi)
        inside = upper if inside is None else mul(inside, upper)
    return inside


defjvp(clip_p, lambda t, out, x, lo, hi: t if lo is None and hi is None
       else mul(t, _clip_mask(x, lo, hi)))


@tensor_method(clip_p)
def clip(x: TensorLike, lo: float | None = None, hi: float | None = None) -> Tensor:
    return clip_p.bind(x, lo=lo, hi=hi)


def _astype_shape(x: Any, dtype: Any, source: Any) -> tuple[Shape, Any]:
    return shape_of(x), dtype


# `source` is the input's dtype: the cotangent is cast back to it.
astype_p = declare("astype", lambda backend, x, dtype, source: backend.astype(x, dtype),
                   _astype_shape)
deflinear(astype_p, lambda ct, x, dtype, source: (astype(ct, source),))


def astype(x: TensorLike, dtype: DTypeLike) -> Tensor:
    """x converted to `dtype`; x itself when it has that dtype already. The gradient is
    cast back to x's dtype."""
    source = dtype_of(x)
    if source == dtype and is_tensor(x):
        return x
    return astype_p.bind(x, dtype=dtype, source=source)


# ---------------------------------------------------------------- trigonometric

# Each derivative reads the input (cos x, -sin x), so the input is what is kept.
sin_p = _unary("sin", Fusion("sin({0})", {"sin": scalar_math.sin}), saves_inputs=True)
cos_p = _unary("cos", Fusion("cos({0})", {"cos": scalar_math.cos}), saves_inputs=True)
defjvp(sin_p, lambda t, out, x: mul(t, cos(x)))
defjvp(cos_p, lambda t, out, x: neg(mul(t, sin(x))))


def sin(x: TensorLike) -> Tensor:
    """Sine, elementwise (radians)."""
    return sin_p.bind1(x)


tensor_method(sin_p)(sin)


def cos(x: TensorLike) -> Tensor:
    """Cosine, elementwise (radians)."""
    return cos_p.bind1(x)


tensor_method(cos_p)(cos)


# ---------------------------------------------------------------- samples for `pullback check`

# Comparisons see equal values too: distinct entries, some of them repeated in b.
_compared = inputs(distinct(3, 4), constant([0.0, 0.05, -0.1, 7.0]))


def _clip_sample(rng: np.random.Generator) -> tuple[np.ndarray]:
    """Inside and outside [-0.5, 0.5], and at least 0.1 from either bound."""
    x = rng.uniform(-1.5, 1.5, (3, 5))
    near = np.abs(np.abs(x) - 0.5) < 0.1
    return (np.where(near, x * 0.5, x),)


def _other_float(x: np.ndarray) -> type[np.floating[Any]]:
    return np.float32 if x.dtype == np.float64 else np.float64


# binary arithmetic: both operands broadcast
declare_check(add_p, add, inputs(normal(2, 1, 4), normal(3, 1)))
declare_check(sub_p, sub, inputs(normal(2, 1, 4), normal(3, 1)))
declare_check(mul_p, mul, inputs(normal(2, 1, 4), normal(3, 1)))
declare_check(div_p, div, inputs(normal(2, 1, 4), nonzero(3, 1)))
declare_check(pow_p, pow, inputs(positive(2, 3), normal(3)))
declare_check(maximum_p, maximum, separated((3, 4), (4,)))
declare_check(minimum_p, minimum, separated((3, 4), (4,)))
# comparisons: bool results, no gradient
declare_check(less_p, less, _compared, reference=np.less)
declare_check(less_equal_p, less_equal, _compared, reference=np.less_equal)
declare_check(greater_p, greater, _compared, reference=np.greater)
declare_check(greater_equal_p, greater_equal, _compared, reference=np.greater_equal)
declare_check(equal_p, equal, _compared, reference=np.equal)
declare_check(not_equal_p, not_equal, _compared, reference=np.not_equal)
# unary
declare_check(neg_p, neg, inputs(normal(3, 4)))
declare_check(sign_p, sign, inputs(nonzero(3, 4)), reference=np.sign)
declare_check(exp_p, exp, inputs(normal(3, 4)))
declare_check(log_p, log, inputs(positive(3, 4)))
declare_check(sqrt_p, sqrt, inputs(positive(3, 4)))
declare_check(abs_p, abs, inputs(nonzero(3, 4)))
declare_check(relu_p, relu, inputs(nonzero(3, 4)))
declare_check(sigmoid_p, sigmoid, inputs(normal(3, 4)))
declare_check(tanh_p, tanh, inputs(normal(3, 4)))
declare_check(silu_p, silu, inputs(normal(3, 4)))
declare_check(softplus_p, softplus, inputs(normal(3, 4)))
declare_check(erf_p, erf, inputs(normal(3, 4)))
declare_check(gelu_p, lambda x: (gelu(x), gelu(x, approximate="tanh")), inputs(normal(3, 4)))
declare_check(sin_p, sin, inputs(normal(3, 4)))
declare_check(cos_p, cos, inputs(normal(3, 4)))
# selection and casts; where's condition is a bool input, held fixed
declare_check(where_p, where, inputs(constant(np.array([[True], [False], [True]])),
                                     normal(3, 4), normal(4)))
declare_check(clip_p, lambda x: (clip(x, -0.5, 0.5), clip(x, lo=-0.5)), _clip_sample)
declare_check(astype_p, lambda x: astype(x, _other_float(x)), inputs(normal(3, 4)))
