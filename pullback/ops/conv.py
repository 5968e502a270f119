"""2-D convolution and pooling (NCHW, weights OIHW, as PyTorch), with dilation and
groups.

conv2d is bilinear; its transposes are written with unfold2d (im2col), fold2d
(its adjoint) and matmul, so that every derivative of a convolution is itself
differentiable. max_pool2d's tangent selects the first maximum of each
window, as PyTorch's backward does.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ad import defbilinear, defjvp, deflinear, defvjp
from ..backend.backward_ops import BackwardOps
from ..backend.current import get_backend
from ..errors import KernelError
from .backward_defaults import backward_kernel
from .checks import declare_check, distinct, inputs, normal
from .elementwise import add, astype, equal, mul, relu_p
from .hints import TensorLike
from .linalg import matmul
from .reduce import max as reduce_max
from .reduce import sum as reduce_sum
from .registry import (
    declare,
    dtype_of,
    is_float,
    shape_of,
    writes_cotangent_into,
    writes_into,
)
from .shape import broadcast_to, reshape, swap_last, transpose

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["avg_pool2d", "conv2d", "max_pool2d"]

# A (height, width) pair of window sizes, strides, paddings or dilations.
_Pair = tuple[int, int]

NO_DILATION: _Pair = (1, 1)


def _int(value: Any) -> int | None:
    # An int, or an integer-like (NumPy's) as int; None for anything else, bools included.
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def pair(op: str, value: int | Sequence[int], name: str) -> tuple[int, int]:
    """An int or a pair of ints as a pair, or a KernelError naming the op and argument."""
    given: Any = (value, value) if _int(value) is not None else value  # what a user passed
    try:
        pair_ = tuple(_int(v) for v in given)
    except TypeError:
        pair_ = ()
    first, second = pair_ if len(pair_) == 2 else (None, None)
    if first is None or second is None:
        raise KernelError(op, (), f"{name} must be an int or a pair of ints, not {value!r}")
    return first, second


def _window_shape(op: str, x: Any, kernel: Sequence[int], stride: _Pair, padding: _Pair,
                  dilation: _Pair = NO_DILATION, operands: tuple[Any, ...] | None = None
                  ) -> tuple[int, ...]:
    """(OH, OW) of a window op on x (N, C, H, W), or a KernelError worded as the
    backends word theirs (pullback.backend.conv)."""
    shape = shape_of(x)
    operands = (x,) if operands is None else operands
    if len(shape) != 4:
        raise KernelError(op, operands, "expected a 4-D input (N, C, H, W)")
    if not is_float(dtype_of(x)):
        raise KernelError(op, operands, "expected a floating dtype")
    for name, value, least in (("kernel", kernel, 1), ("stride", stride, 1),
                               ("padding", padding, 0), ("dilation", dilation, 1)):
        if min(value) < least:
            bound = "positive" if least else "non-negative"
            raise KernelError(op, operands, f"{name} {tuple(value)} must be {bound}")
    span = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation))
    padded = (shape[2] + 2 * padding[0], shape[3] + 2 * padding[1])
    if span[0] > padded[0] or span[1] > padded[1]:
        what = f"kernel {kernel[0]}x{kernel[1]}"
        if tuple(dilation) != NO_DILATION:
            what += f" dilated by {tuple(dilation)} ({span[0]}x{span[1]})"
        raise KernelError(
            op, operands, f"{what} is larger than the padded input {padded[0]}x{padded[1]}"
        )
    return tuple((p - k) // s + 1 for p, k, s in zip(padded, span, stride))


# ---------------------------------------------------------------- im2col and its adjoint


def _unfold_shape(x: Any, kernel: _Pair, stride: _Pair, padding: _Pair, pad_value: float,
                  dilation: _Pair) -> tuple[Any, ...]:
    oh, ow = _window_shape("unfold2d", x, kernel, stride, padding, dilation)
    n, c = shape_of(x)[:2]
    return (n, c, *kernel, oh, ow), dtype_of(x)


unfold2d_p = declare(
    "unfold2d",
    lambda backend, x, kernel, stride, padding, pad_value, dilation: backend.unfold2d(
        x, kernel, stride, padding, pad_value, dilation),
    _unfold_shape,
    aliasing="fresh",
)


def unfold2d(x: TensorLike, kernel: tuple[int, int], stride: tuple[int, int],
             padding: tuple[int, int], pad_value: float = 0.0,
             dilation: tuple[int, int] = NO_DILATION) -> Tensor:
    """Sliding windows as (N, C, kh, kw, OH, OW), taps `dilation` apart."""
    return unfold2d_p.bind(x, kernel=kernel, stride=stride, padding=padding, pad_value=pad_value,
                           dilation=tuple(dilation))


def _fold_shape(
    cols: Any, input_shape: Sequence[int], kernel: _Pair, stride: _Pair, padding: _Pair,
    dilation: _Pair,
) -> tuple[Any, ...]:
    return tuple(input_shape), dtype_of(cols)


fold2d_p = declare(
    "fold2d",
    lambda backend, cols, input_shape, kernel, stride, padding, dilation: backend.fold2d(
        cols, input_shape, kernel, stride, padding, dilation),
    _fold_shape,
    aliasing="fresh",
)


def fold2d(cols: TensorLike, input_shape: Sequence[int], kernel: tuple[int, int],
           stride: tuple[int, int], padding: tuple[int, int],
           dilation: tuple[int, int] = NO_DILATION) -> Tensor:
    """Sum windows (N, C, kh, kw, OH, OW) back into an input of `input_shape`."""
    return fold2d_p.bind(cols, input_shape=tuple(input_shape), kernel=kernel, stride=stride,
                         padding=padding, dilation=tuple(dilation))


deflinear(unfold2d_p, lambda ct, x, kernel, stride, padding, pad_value, dilation: (
    fold2d(ct, x.shape, kernel, stride, padding, dilation),))
# The tangent of a window of padding is zero whatever the padding value.
defjvp(unfold2d_p, lambda t, out, x, kernel, stride, padding, pad_value, dilation: unfold2d(
    t, kernel, stride, padding, 0.0, dilation))
deflinear(fold2d_p, lambda ct, cols, input_shape, kernel, stride, padding, dilation: (
    unfold2d(ct, kernel, stride, padding, 0.0, dilation),))

# ---------------------------------------------------------------- convolution


def _conv_shape(x: Any, w: Any, stride: _Pair, padding: _Pair, dilation: _Pair,
                groups: int) -> tuple[Any, ...]:
    sx, sw = shape_of(x), shape_of(w)
    if len(sx) != 4 or len(sw) != 4:
        raise KernelError(
            "conv2d", (x, w),
            "expected a 4-D input (N, C, H, W) and 4-D weight (O, C / groups, kh, kw)",
        )
    if sx[1] % groups or sw[0] % groups:
        raise KernelError(
            "conv2d", (x, w),
            f"groups {groups} must divide both the input channels {sx[1]} and the output "
            f"channels {sw[0]}",
        )
    if sw[1] * groups != sx[1]:
        want = "" if groups == 1 else f" / groups {groups} = {sx[1] // groups}"
        raise KernelError(
            "conv2d", (x, w), f"weight has {sw[1]} input channels but input has {sx[1]}{want}"
        )
    if str(dtype_of(x)) != str(dtype_of(w)) or not is_float(dtype_of(x)):
        raise KernelError("conv2d", (x, w), "input and weight must share one floating dtype")
    oh, ow = _window_shape("conv2d", x, sw[2:], stride, padding, dilation, (x, w))
    return (sx[0], sw[0], oh, ow), dtype_of(x)


conv2d_p = declare(
    "conv2d",
    lambda backend, x, w, stride, padding, dilation, groups: backend.conv2d(
        x, w, stride, padding, dilation, groups),
    _conv_shape,
    aliasing="fresh",
)
writes_into(conv2d_p, lambda backend, x, w, out, stride, padding, dilation, groups:
            backend.conv2d(x, w, stride, padding, dilation, groups, out=out))


def _conv_transpose_input(ct: Any, x: Any, w: Any, stride: _Pair, padding: _Pair,
                          dilation: _Pair, groups: int) -> Any:
    n, c, _, _ = shape_of(x)
    o, cg, kh, kw = shape_of(w)
    oh, ow = shape_of(ct)[2:]
    # Per group: (C/g kh kw, O/g) @ (O/g, OH OW), broadcast over the batch.
    w_t = swap_last(reshape(w, (groups, o // groups, cg * kh * kw)))
    cols = matmul(w_t, reshape(ct, (n, groups, o // groups, oh * ow)))
    return fold2d(reshape(cols, (n, c, kh, kw, oh, ow)), shape_of(x), (kh, kw), stride, padding,
                  dilation)


def _conv_transpose_weight(ct: Any, x: Any, w: Any, stride: _Pair, padding: _Pair,
                           dilation: _Pair, groups: int) -> Any:
    n = shape_of(x)[0]
    o, cg, kh, kw = shape_of(w)
    oh, ow = shape_of(ct)[2:]
    pixels = n * oh * ow
    # Per group: (O/g, N OH OW) @ (N OH OW, C/g kh kw), the batch folded into the product.
    cols = reshape(unfold2d(x, (kh, kw), stride, padding, 0.0, dilation),
                   (n, groups, cg * kh * kw, oh * ow))
    cols = reshape(transpose(cols, (1, 2, 0, 3)), (groups, cg * kh * kw, pixels))
    ct_rows = reshape(ct, (n, groups, o // groups, oh * ow))
    ct_rows = reshape(transpose(ct_rows, (1, 2, 0, 3)), (groups, o // groups, pixels))
    return reshape(matmul(ct_rows, swap_last(cols)), shape_of(w))


defbilinear(conv2d_p, _conv_transpose_input, _conv_transpose_weight)


def _conv_vjp(be: BackwardOps, g: Any, n: Any) -> tuple[Any, ...]:
    x, w = n.inputs  # only what each active operand's gradient needs was saved
    x_shape, w_shape = n.in_shapes
    p = n.params
    geometry = (p["stride"], p["padding"], p["dilation"], p["groups"])
    # The weight's first: it may take the windows the forward left in the backend's
    # scratch, which the input's gradient then overwrites (backend/conv.py).
    grad_w = be.conv2d_weight_backward(g, x, w_shape, *geometry) if n.parents[1] else None
    return (be.conv2d_input_backward(g, w, x_shape, *geometry) if n.parents[0] else None,
            grad_w)


defvjp(conv2d_p, _conv_vjp)
backward_kernel(conv2d_p, "conv2d_input_backward")
backward_kernel(conv2d_p, "conv2d_weight_backward")


def _conv_ct_into(be: BackwardOps, g: Any, n: Any, out: Any) -> tuple[Any, ...]:
    """_conv_vjp with the input's gradient written into `out`."""
    x, w = n.inputs
    p = n.params
    geometry = (p["stride"], p["padding"], p["dilation"], p["groups"])
    grad_w = (be.conv2d_weight_backward(g, x, n.in_shapes[1], *geometry)
              if n.parents[1] is not None else None)  # first, as in _conv_vjp
    return be.conv2d_input_backward(g, w, n.in_shapes[0], *geometry, out=out), grad_w


writes_cotangent_into(
    conv2d_p,
    lambda args, first, by_columns, first_by_columns: "C" if args[1].dtype == first.dtype
    else None,
    _conv_ct_into)


def _groups(value: Any) -> int:
    groups = _int(value)
    if groups is None or groups < 1:
        raise KernelError("conv2d", (), f"groups must be a positive int, not {value!r}")
    return groups


def conv2d(x: TensorLike, w: TensorLike, b: TensorLike | None = None,
           stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
           dilation: int | tuple[int, int] = 1, groups: int = 1) -> Tensor:
    """2-D cross-correlation, NCHW input, weight (O, C / groups, kh, kw), optional bias
    of shape (O,); kernel taps `dilation` apart, channels in `groups` independent
    groups, as PyTorch's and ONNX's Conv (symmetric padding)."""
    y = conv2d_p.bind(x, w, stride=pair("conv2d", stride, "stride"),
                      padding=pair("conv2d", padding, "padding"),
                      dilation=pair("conv2d", dilation, "dilation"), groups=_groups(groups))
    if b is None:
        return y
    if shape_of(b) != (shape_of(w)[0],):
        raise KernelError("conv2d", (x, w, b), f"bias must have shape ({shape_of(w)[0]},)")
    return add(y, reshape(b, (1, shape_of(w)[0], 1, 1)))


# ---------------------------------------------------------------- pooling


def _max_pool_shape(x: Any, kernel: _Pair, stride: _Pair, padding: _Pair,
                    dilation: _Pair) -> tuple[Any, ...]:
    oh, ow = _window_shape("max_pool2d", x, kernel, stride, padding, dilation)
    return shape_of(x)[:2] + (oh, ow), dtype_of(x)


def _avg_pool_shape(x: Any, kernel: _Pair, stride: _Pair, padding: _Pair) -> tuple[Any, ...]:
    oh, ow = _window_shape("avg_pool2d", x, kernel, stride, padding)
    return shape_of(x)[:2] + (oh, ow), dtype_of(x)


max_pool2d_p = declare(
    "max_pool2d",
    lambda backend, x, kernel, stride, padding, dilation: backend.max_pool2d(
        x, kernel, stride, padding, dilation),
    _max_pool_shape,
    saves_inputs=True,
    saves_output=True,
    aliasing="fresh",
)
writes_into(max_pool2d_p, lambda backend, x, out, kernel, stride, padding, dilation:
            backend.max_pool2d(x, kernel, stride, padding, dilation, out=out))


def _first_max_mask(x: Any, out: Any, kernel: _Pair, stride: _Pair, padding: _Pair,
                    dilation: _Pair) -> Any:
    """One-hot (N, C, kh, kw, OH, OW) marking the first maximum of each window."""
    kh, kw = kernel
    cols = unfold2d(x, kernel, stride, padding, float("-inf"), dilation)
    n, c, oh, ow = shape_of(out)
    hits = astype(equal(cols, reshape(out, (n, c, 1, 1, oh, ow))), dtype_of(x))
    # Rank the window positions so that the earliest hit scores highest.
    backend = get_backend()
    ramp = backend.reshape(backend.arange(kh * kw, 0, -1, dtype_of(x)), (1, 1, kh, kw, 1, 1))
    scored = mul(hits, ramp)
    return astype(equal(scored, reduce_max(scored, (2, 3), True)), dtype_of(x))


def _max_pool_jvp(t: Any, out: Any, x: Any, kernel: _Pair, stride: _Pair, padding: _Pair,
                  dilation: _Pair) -> Any:
    mask = _first_max_mask(x, out, kernel, stride, padding, dilation)
    return reduce_sum(mul(unfold2d(t, kernel, stride, padding, 0.0, dilation), mask), (2, 3))


defjvp(max_pool2d_p, _max_pool_jvp)
defvjp(max_pool2d_p, lambda be, g, n: (be.max_pool2d_backward(
    g, n.inputs[0], n.output, n.params["kernel"], n.params["stride"], n.params["padding"],
    n.params["dilation"]),))
backward_kernel(max_pool2d_p, "max_pool2d_backward")
writes_cotangent_into(
    max_pool2d_p, lambda args, first, by_columns, first_by_columns: "C",
    lambda be, g, n, out: (be.max_pool2d_backward(
        g, n.inputs[0], n.output, n.params["kernel"], n.params["stride"], n.params["padding"],
        n.params["dilation"], out=out),))
# The pool routes each upstream value to its window's maximum; where a relu feeds it,
# that maximum is relu's output, so relu's mask can be applied to the small upstream
# before the routing: one pass over the large gradient saved.
max_pool2d_p.absorbs = relu_p

avg_pool2d_p = declare(
    "avg_pool2d",
    lambda backend, x, kernel, stride, padding: backend.avg_pool2d(x, kernel, stride, padding),
    _avg_pool_shape,
    aliasing="fresh",
)
writes_into(avg_pool2d_p, lambda backend, x, out, kernel, stride, padding:
            backend.avg_pool2d(x, kernel, stride, padding, out=out))


def _avg_pool_transpose(ct: Any, x: Any, kernel: _Pair, stride: _Pair, padding: _Pair
                        ) -> tuple[Any, ...]:
    n, c, oh, ow = shape_of(ct)
    kh, kw = kernel
    share = reshape(mul(ct, 1.0 / (kh * kw)), (n, c, 1, 1, oh, ow))
    cols = broadcast_to(share, (n, c, kh, kw, oh, ow))
    return (fold2d(cols, shape_of(x), kernel, stride, padding),)


deflinear(avg_pool2d_p, _avg_pool_transpose)
defvjp(avg_pool2d_p, lambda be, g, n: (be.avg_pool2d_backward(
    g, n.in_shapes[0], n.params["kernel"], n.params["stride"], n.params["padding"]),))
backward_kernel(avg_pool2d_p, "avg_pool2d_backward")
writes_cotangent_into(
    avg_pool2d_p, lambda args, first, by_columns, first_by_columns: "C",
    lambda be, g, n, out: (be.avg_pool2d_backward(
        g, n.in_shapes[0], n.params["kernel"], n.params["stride"], n.params["padding"],
        out=out),))


def _pool_args(op: str, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None,
               padding: int | Sequence[int]) -> dict[str, _Pair]:
    kernel = pair(op, kernel_size, "kernel_size")
    return {
        "kernel": kernel,
        "stride": kernel if stride is None else pair(op, stride, "stride"),
        "padding": pair(op, padding, "padding"),
    }


def max_pool2d(x: TensorLike, kernel_size: int | tuple[int, int],
               stride: int | tuple[int, int] | None = None, padding: int | tuple[int, int] = 0,
               dilation: int | tuple[int, int] = 1) -> Tensor:
    """Maximum over each window (padding reads as -inf), taps `dilation` apart; the
    gradient goes to the first maximum of each window in row-major order."""
    return max_pool2d_p.bind(x, **_pool_args("max_pool2d", kernel_size, stride, padding),
                             dilation=pair("max_pool2d", dilation, "dilation"))


def avg_pool2d(x: TensorLike, kernel_size: int | tuple[int, int],
               stride: int | tuple[int, int] | None = None,
               padding: int | tuple[int, int] = 0) -> Tensor:
    """Mean over each window, padding counted as zeros (count_include_pad=True)."""
    return avg_pool2d_p.bind(x, **_pool_args("avg_pool2d", kernel_size, stride, padding))


# ---------------------------------------------------------------- samples for `pullback check`

_CONV: dict[str, Any] = {"stride": (2, 1), "padding": (1, 0)}
_WINDOW: dict[str, Any] = {"kernel": (2, 3), "stride": (2, 1), "padding": (1, 0)}


def _conv_variants(x: Any, w: Any, b: Any) -> tuple[Any, ...]:
    """conv2d plain, dilated, grouped and depthwise: w (2, 4, 3, 2) reshaped to each
    grouping's (O, C / groups, kh, kw)."""
    return (
        conv2d(x, w, b, **_CONV),
        conv2d(x, w, b, padding=(2, 1), dilation=(2, 3)),
        conv2d(x, reshape(w, (4, 2, 3, 2)), stride=(1, 2), groups=2),
        conv2d(x, reshape(w, (8, 1, 3, 2)), padding=1, dilation=(1, 2), groups=4),
    )


def _fold_sample(rng: np.random.Generator) -> tuple[Any, ...]:
    return (rng.standard_normal((1, 2, 2, 3, 3, 3)),)


declare_check(unfold2d_p, lambda x: (unfold2d(x, **_WINDOW),
                                     unfold2d(x, **_WINDOW, dilation=(2, 1))),
              inputs(normal(1, 2, 5, 5)))
declare_check(fold2d_p, lambda c: (fold2d(c, (1, 2, 5, 5), **_WINDOW),
                                   fold2d(c, (1, 2, 5, 5), **_WINDOW, dilation=(2, 1))),
              _fold_sample)
declare_check(conv2d_p, _conv_variants,
              inputs(normal(2, 4, 4, 4), normal(2, 4, 3, 2), normal(2)))
declare_check(max_pool2d_p, lambda x: (max_pool2d(x, 2), max_pool2d(x, 3, 2, 1),
                                       max_pool2d(x, 2, 1, 1, dilation=(2, 3))),
              inputs(distinct(1, 2, 5, 6)))
declare_check(avg_pool2d_p, lambda x: (avg_pool2d(x, 2), avg_pool2d(x, 3, 2, 1)),
              inputs(normal(1, 2, 5, 6)))
