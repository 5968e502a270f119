"""The op test table: one row per op and case, in the manner of JAX's grad_test_spec.

Each row names a pullback callable, the PyTorch callable it must agree with, the
input shapes and each input's domain (log on positives, max without ties), and
whether the op is checked to second order. `test_op_table.py` runs every row
through the same checkers; `THREADED_ROWS` repeats a few with large inputs.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

import pullback as pb
from pullback.ops.batchnorm import batch_norm_statistics_p

Domain = Callable[[np.random.Generator, tuple], np.ndarray]


# ---------------------------------------------------------------- input domains


def real(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return rng.standard_normal(shape)


def positive(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return rng.uniform(0.5, 2.0, shape)


def nonzero(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Away from 0: denominators, and the kinks of relu and abs."""
    return rng.uniform(0.4, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


def distinct(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """No two values within 0.06 of each other: max reductions and pools without ties."""
    n = int(np.prod(shape, dtype=np.int64))
    spread = (rng.permutation(n) - n / 2) * 0.1 + rng.uniform(-0.02, 0.02, n)
    return spread.reshape(shape)


CLIP_LO, CLIP_HI = -0.5, 0.75  # exact in float32, so ties with the bounds are exact


def off_clip_bounds(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Below, inside and above [CLIP_LO, CLIP_HI], at least 0.1 from either bound."""
    pieces = np.array([[-2.0, CLIP_LO - 0.1], [CLIP_LO + 0.1, CLIP_HI - 0.1], [CLIP_HI + 0.1, 2.0]])
    chosen = pieces[rng.integers(0, 3, shape)]
    return rng.uniform(chosen[..., 0], chosen[..., 1])


def wide(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Where exp overflows float32 if computed naively: saturating activations, softmax."""
    return rng.uniform(-120.0, 120.0, shape)


def few_values(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Small integers, so max reductions, maximum and pools see ties."""
    return rng.integers(0, 3, shape).astype(np.float64)


def on_clip_bounds(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Exactly CLIP_LO or CLIP_HI, or well inside or outside: the closed interval's edges."""
    return rng.choice([-1.5, CLIP_LO, 0.0, CLIP_HI, 1.5], shape)


# ---------------------------------------------------------------- the row type


@dataclass(frozen=True)
class OpSpec:
    name: str
    pb_fn: Callable
    torch_fn: Callable
    shapes: tuple[tuple, ...]
    domains: tuple[Domain, ...]
    order: int = 2  # 2: second derivatives are checked too
    sums: bool = False  # reduces over many products (matmul, conv): looser float32 tolerance

    def inputs(self, dtype: np.dtype, salt: str = "") -> list[np.ndarray]:
        rng = rng_for(self.name + salt)
        return [d(rng, s).astype(dtype) for d, s in zip(self.domains, self.shapes, strict=True)]

    def __repr__(self) -> str:
        return self.name


def rng_for(name: str) -> np.random.Generator:
    """A generator seeded by the row name, so a row's inputs do not depend on table order."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def op(name: str, pb_fn: Callable, torch_fn: Callable, *shapes: tuple,
       domain: Domain | Sequence[Domain] = real, order: int = 2, sums: bool = False) -> OpSpec:
    domains = tuple(domain) if isinstance(domain, Sequence) else (domain,) * len(shapes)
    return OpSpec(name, pb_fn, torch_fn, tuple(shapes), domains, order, sums)


def t(value: float) -> torch.Tensor:
    """A 0-d float64 tensor: PyTorch's stand-in for a Python scalar operand."""
    return torch.tensor(value, dtype=torch.float64)


# ---------------------------------------------------------------- elementwise


UNARY = [
    ("neg", pb.neg, torch.neg, real),
    ("neg_operator", lambda x: -x, lambda x: -x, real),
    ("exp", pb.exp, torch.exp, real),
    ("log", pb.log, torch.log, positive),
    ("sqrt", pb.sqrt, torch.sqrt, positive),
    ("abs", pb.abs, torch.abs, nonzero),
    ("relu", pb.relu, torch.relu, nonzero),
    ("sigmoid", pb.sigmoid, torch.sigmoid, real),
    ("tanh", pb.tanh, torch.tanh, real),
    ("silu", pb.silu, F.silu, real),
    ("softplus", pb.softplus, F.softplus, real),
    ("gelu", pb.gelu, F.gelu, real),
    ("gelu_tanh", lambda x: pb.gelu(x, approximate="tanh"),
     lambda x: F.gelu(x, approximate="tanh"), real),
]

# (name, pb function, torch function, lhs domain, rhs domain, a Python-scalar operand)
BINARY = [
    ("add", pb.add, torch.add, real, real, 1.5),
    ("sub", pb.sub, torch.sub, real, real, 0.75),
    ("mul", pb.mul, torch.mul, real, real, 2.5),
    ("div", pb.div, torch.div, real, nonzero, 4.0),
    ("pow", pb.pow, torch.pow, positive, real, 2.0),
    ("maximum", pb.maximum, torch.maximum, real, real, 0.25),
    ("minimum", pb.minimum, torch.minimum, real, real, 0.25),
]

BROADCASTS = [
    ("same_shape", (3, 4), (3, 4)),
    ("col_with_row", (3, 1), (1, 4)),
    ("batch_with_vector", (2, 3, 4), (4,)),
    ("vector_with_batch", (4,), (2, 3, 4)),
]


def _binary_rows() -> list[OpSpec]:
    rows = []
    for name, pb_fn, torch_fn, lhs, rhs, c in BINARY:
        for case, sa, sb in BROADCASTS:
            rows.append(op(f"{name}_{case}", pb_fn, torch_fn, sa, sb, domain=(lhs, rhs)))
        # A Python scalar on either side; the tensor keeps its dtype.
        rows.append(op(f"{name}_scalar_rhs", lambda x, f=pb_fn, c=c: f(x, c),
                       lambda x, f=torch_fn, c=c: f(x, t(c)), (3, 4), domain=lhs))
        rows.append(op(f"{name}_scalar_lhs", lambda x, f=pb_fn, c=c: f(c, x),
                       lambda x, f=torch_fn, c=c: f(t(c), x), (3, 4), domain=rhs))
    return rows


OPERATOR_ROWS = [
    op("add_operator_scalar_both_sides", lambda x: 1.5 + x + 2.0, lambda x: 1.5 + x + 2.0, (3, 4)),
    op("sub_operator_rsub", lambda x, y: 2.0 - x - y, lambda x, y: 2.0 - x - y, (3, 1), (1, 4)),
    op("mul_operator", lambda x, y: x * y * 3.0, lambda x, y: x * y * 3.0, (2, 3, 4), (3, 1)),
    op("div_operator_rtruediv", lambda x: 3.0 / x, lambda x: 3.0 / x, (3, 4), domain=nonzero),
    op("div_operator", lambda x, y: x / y, lambda x, y: x / y, (4,), (2, 3, 4),
       domain=(real, nonzero)),
    op("pow_operator_integer_exponent", lambda x: x ** 3.0, lambda x: x ** 3.0, (3, 4)),
    op("pow_operator_fractional_exponent", lambda x: x ** 2.5, lambda x: x ** 2.5, (3, 4),
       domain=positive),
    op("pow_operator_rpow", lambda x: 2.0 ** x, lambda x: 2.0 ** x, (3, 4)),
    op("pow_operator_tensors", lambda x, y: x ** y, lambda x, y: x ** y, (3, 1), (1, 4),
       domain=(positive, real)),
]

COND_COL = np.array([[True], [False], [True]])
COND_FULL = np.array([[True, False, False, True], [False, True, True, False], [True] * 4])

OTHER_ELEMENTWISE = [
    op("clip", lambda x: pb.clip(x, CLIP_LO, CLIP_HI),
       lambda x: torch.clamp(x, CLIP_LO, CLIP_HI), (4, 5), domain=off_clip_bounds),
    op("where_broadcast", lambda a, b: pb.where(pb.tensor(COND_COL), a, b),
       lambda a, b: torch.where(torch.tensor(COND_COL), a, b), (1, 4), (3, 4)),
    op("where_broadcast_cond_and_scalar_branch",
       lambda a: pb.where(pb.tensor(COND_FULL), a, 0.5),
       lambda a: torch.where(torch.tensor(COND_FULL), a, t(0.5)), (4,)),
    op("where_same_shape", lambda a, b: pb.where(pb.tensor(COND_FULL), a, b),
       lambda a, b: torch.where(torch.tensor(COND_FULL), a, b), (3, 4), (3, 4)),
]


# ---------------------------------------------------------------- matmul


MATMUL_ROWS = [
    op("matmul_matrix", pb.matmul, torch.matmul, (3, 4), (4, 5), sums=True),
    op("matmul_operator", lambda a, b: a @ b, lambda a, b: a @ b, (3, 4), (4, 2), sums=True),
    op("matmul_batched", pb.matmul, torch.matmul, (2, 3, 4), (2, 4, 5), sums=True),
    op("matmul_broadcast_batch_dims", pb.matmul, torch.matmul, (2, 1, 3, 4), (5, 4, 2),
       sums=True),
    op("matmul_batch_with_matrix", pb.matmul, torch.matmul, (2, 3, 4), (4, 5), sums=True),
    op("matmul_vector_lhs", pb.matmul, torch.matmul, (4,), (4, 5), sums=True),
    op("matmul_vector_lhs_batched_rhs", pb.matmul, torch.matmul, (4,), (2, 4, 3), sums=True),
    op("matmul_vector_rhs", pb.matmul, torch.matmul, (2, 3, 4), (4,), sums=True),
    op("matmul_vector_vector", pb.matmul, torch.matmul, (5,), (5,), sums=True),
]


# ---------------------------------------------------------------- reductions and softmax


def _amax(x: torch.Tensor, dim: object = None, keepdim: bool = False) -> torch.Tensor:
    return x.amax() if dim is None else x.amax(dim=dim, keepdim=keepdim)


REDUCTION_ROWS = [
    op("sum_all", pb.sum, torch.sum, (3, 4)),
    op("sum_axis", lambda x: pb.sum(x, axis=1), lambda x: x.sum(dim=1), (2, 3, 4)),
    op("sum_negative_axis", lambda x: pb.sum(x, axis=-1), lambda x: x.sum(dim=-1), (2, 3, 4)),
    op("sum_axes_tuple_keepdims", lambda x: pb.sum(x, axis=(0, 2), keepdims=True),
       lambda x: x.sum(dim=(0, 2), keepdim=True), (2, 3, 4)),
    op("mean_all", pb.mean, torch.mean, (3, 4)),
    op("mean_axis", lambda x: pb.mean(x, axis=0), lambda x: x.mean(dim=0), (3, 4)),
    op("mean_axes_tuple_keepdims", lambda x: pb.mean(x, axis=(0, 2), keepdims=True),
       lambda x: x.mean(dim=(0, 2), keepdim=True), (2, 3, 4)),
    op("max_all", pb.max, _amax, (3, 4), domain=distinct),
    op("max_axis", lambda x: pb.max(x, axis=1), lambda x: _amax(x, 1), (2, 3, 4),
       domain=distinct),
    op("max_axes_tuple_keepdims", lambda x: pb.max(x, axis=(0, 2), keepdims=True),
       lambda x: _amax(x, (0, 2), True), (2, 3, 4), domain=distinct),
    op("softmax_last_axis", pb.softmax, lambda x: torch.softmax(x, dim=-1), (3, 5)),
    op("softmax_axis_0", lambda x: pb.softmax(x, axis=0), lambda x: torch.softmax(x, dim=0),
       (3, 5)),
    op("softmax_middle_axis", lambda x: pb.softmax(x, axis=1),
       lambda x: torch.softmax(x, dim=1), (2, 3, 4)),
    op("log_softmax_last_axis", pb.log_softmax, lambda x: torch.log_softmax(x, dim=-1), (3, 5)),
    op("log_softmax_axis_0", lambda x: pb.log_softmax(x, axis=0),
       lambda x: torch.log_softmax(x, dim=0), (3, 5)),
    op("layer_norm_rows", pb.layer_norm,
       lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b), (3, 5), (5,), (5,), sums=True),
    op("layer_norm_batched_eps", lambda x, w, b: pb.layer_norm(x, w, b, eps=0.1),
       lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, eps=0.1), (2, 3, 4), (4,), (4,),
       sums=True),
]


# ---------------------------------------------------------------- shape ops and indexing


REPEATED = np.array([0, 2, 2])

SHAPE_ROWS = [
    op("reshape_with_minus_one", lambda x: pb.reshape(x, (4, -1)),
       lambda x: x.reshape(4, -1), (2, 3, 4)),
    op("reshape_flatten", lambda x: pb.reshape(x, (24,)), lambda x: x.reshape(24), (2, 3, 4)),
    op("transpose_default_reverses", pb.transpose, lambda x: x.permute(2, 1, 0), (2, 3, 4)),
    op("transpose_explicit_axes", lambda x: pb.transpose(x, (1, 2, 0)),
       lambda x: x.permute(1, 2, 0), (2, 3, 4)),
    op("transpose_negative_axes", lambda x: pb.transpose(x, (0, -1, -2)),
       lambda x: x.permute(0, 2, 1), (2, 3, 4)),
    op("T_property", lambda x: x.T, lambda x: x.T, (3, 4)),
    op("broadcast_to_leading_axes", lambda x: pb.broadcast_to(x, (2, 3, 4)),
       lambda x: x.broadcast_to(2, 3, 4), (3, 1)),
    op("broadcast_to_vector", lambda x: pb.broadcast_to(x, (3, 4)),
       lambda x: x.broadcast_to(3, 4), (4,)),
    op("getitem_slices_with_step", lambda x: x[1:, ::2], lambda x: x[1:, ::2], (4, 6)),
    op("getitem_int", lambda x: x[0], lambda x: x[0], (3, 4)),
    op("getitem_negative_int_and_slice", lambda x: x[-1, 1:3], lambda x: x[-1, 1:3], (3, 4)),
    op("getitem_none", lambda x: x[..., None], lambda x: x[..., None], (3, 4)),
    op("getitem_ellipsis_int", lambda x: x[..., 1], lambda x: x[..., 1], (2, 3, 4)),
    op("getitem_int_none_slice", lambda x: x[1, None, :2], lambda x: x[1, None, :2], (3, 4)),
    op("getitem_negative_step", lambda x: x[::-1], lambda x: x.flip(0), (4, 3)),
    op("getitem_int_array_repeated", lambda x: x[REPEATED],
       lambda x: x[torch.from_numpy(REPEATED)], (4, 3)),
    op("getitem_int_array_on_axis_1", lambda x: x[:, REPEATED],
       lambda x: x[:, torch.from_numpy(REPEATED)], (2, 4)),
    op("concatenate_axis_1", lambda a, b: pb.concatenate([a, b], axis=1),
       lambda a, b: torch.cat([a, b], dim=1), (2, 3), (2, 5)),
    op("concatenate_axis_0", lambda a, b, c: pb.concatenate([a, b, c], axis=0),
       lambda a, b, c: torch.cat([a, b, c], dim=0), (1, 3), (2, 3), (3, 3)),
    op("concatenate_same_input_twice", lambda a: pb.concatenate([a, a], axis=-1),
       lambda a: torch.cat([a, a], dim=-1), (2, 3)),
    op("stack_axis_1", lambda a, b, c: pb.stack([a, b, c], axis=1),
       lambda a, b, c: torch.stack([a, b, c], dim=1), (2, 3), (2, 3), (2, 3)),
    op("stack_axis_0", lambda a, b: pb.stack([a, b], axis=0),
       lambda a, b: torch.stack([a, b], dim=0), (4,), (4,)),
]


# ---------------------------------------------------------------- gathers (take, take_along_axis)

# Repeated and negative indices: the scatter-add transposes must accumulate and wrap. PyTorch's
# gather refuses negative indices, so its side reads them wrapped.
TAKE_ROWS_INDEX = np.array([[0, 2], [2, -1], [3, 2]])
ALONG_INDEX = np.array([[1, 1], [0, -1], [3, 1]])


def _wrapped(indices: np.ndarray, size: int) -> torch.Tensor:
    return torch.from_numpy(indices % size)


GATHER_ROWS = [
    op("take_rows_repeated_and_negative", lambda x: pb.take(x, TAKE_ROWS_INDEX),
       lambda x: x[_wrapped(TAKE_ROWS_INDEX, 4)], (4, 3)),
    op("take_middle_axis", lambda x: pb.take(x, TAKE_ROWS_INDEX[0], axis=1),
       lambda x: x[:, _wrapped(TAKE_ROWS_INDEX[0], 4)], (2, 4, 3)),
    op("take_scalar_index_negative_axis", lambda x: pb.take(x, -1, axis=-1),
       lambda x: x[..., -1], (2, 3)),
    op("take_along_axis_rows", lambda x: pb.take_along_axis(x, ALONG_INDEX, 1),
       lambda x: torch.gather(x, 1, _wrapped(ALONG_INDEX, 4)), (3, 4)),
    op("take_along_axis_broadcasts_x_and_indices",
       lambda x: pb.take_along_axis(x, ALONG_INDEX[:, None, :], 2),
       lambda x: torch.take_along_dim(x, _wrapped(ALONG_INDEX[:, None, :], 4), 2), (1, 2, 4)),
    op("take_along_axis_axis_0", lambda x: pb.take_along_axis(x, ALONG_INDEX[:2] % 3, 0),
       lambda x: torch.gather(x, 0, _wrapped(ALONG_INDEX[:2], 3)), (3, 2)),
]


# ---------------------------------------------------------------- convolution and pooling


CONV_ROWS = [
    op("conv2d_stride_2_padding_1_bias",
       lambda x, w, b: pb.conv2d(x, w, b, stride=2, padding=1),
       lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
       (2, 3, 7, 7), (4, 3, 3, 3), (4,), sums=True),
    op("conv2d_non_square_kernel", pb.conv2d, F.conv2d, (1, 2, 6, 5), (3, 2, 3, 2), sums=True),
    op("conv2d_pair_stride_and_padding",
       lambda x, w: pb.conv2d(x, w, stride=(2, 1), padding=(0, 1)),
       lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(0, 1)),
       (2, 2, 5, 6), (2, 2, 2, 3), sums=True),
    op("conv2d_dilation",
       lambda x, w: pb.conv2d(x, w, dilation=2), lambda x, w: F.conv2d(x, w, dilation=2),
       (2, 2, 7, 6), (3, 2, 3, 2), sums=True),
    op("conv2d_groups_bias",
       lambda x, w, b: pb.conv2d(x, w, b, groups=2), lambda x, w, b: F.conv2d(x, w, b, groups=2),
       (2, 4, 5, 5), (6, 2, 3, 3), (6,), sums=True),
    op("conv2d_depthwise_stride_padding",
       lambda x, w: pb.conv2d(x, w, stride=2, padding=1, groups=3),
       lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=3),
       (2, 3, 6, 7), (6, 1, 3, 3), sums=True),
    op("conv2d_all_parameters_as_pairs",
       lambda x, w: pb.conv2d(x, w, stride=(1, 2), padding=(2, 1), dilation=(2, 3), groups=2),
       lambda x, w: F.conv2d(x, w, stride=(1, 2), padding=(2, 1), dilation=(2, 3), groups=2),
       (1, 4, 6, 8), (2, 2, 2, 3), sums=True),
    op("max_pool2d_default_stride", lambda x: pb.max_pool2d(x, 2),
       lambda x: F.max_pool2d(x, 2), (2, 3, 4, 6), domain=distinct),
    op("max_pool2d_stride_not_kernel", lambda x: pb.max_pool2d(x, 3, stride=2),
       lambda x: F.max_pool2d(x, 3, stride=2), (2, 2, 7, 7), domain=distinct),
    op("max_pool2d_padding", lambda x: pb.max_pool2d(x, 3, stride=2, padding=1),
       lambda x: F.max_pool2d(x, 3, stride=2, padding=1), (1, 2, 6, 6), domain=distinct),
    op("max_pool2d_dilation", lambda x: pb.max_pool2d(x, 2, stride=1, padding=1, dilation=2),
       lambda x: F.max_pool2d(x, 2, stride=1, padding=1, dilation=2), (1, 2, 5, 6),
       domain=distinct),
    op("max_pool2d_pair_dilation", lambda x: pb.max_pool2d(x, (3, 2), (2, 1), dilation=(1, 3)),
       lambda x: F.max_pool2d(x, (3, 2), (2, 1), dilation=(1, 3)), (2, 2, 7, 8),
       domain=distinct),
    op("avg_pool2d_default_stride", lambda x: pb.avg_pool2d(x, 2),
       lambda x: F.avg_pool2d(x, 2), (2, 3, 4, 6)),
    op("avg_pool2d_stride_and_padding", lambda x: pb.avg_pool2d(x, 3, stride=2, padding=1),
       lambda x: F.avg_pool2d(x, 3, stride=2, padding=1), (1, 2, 6, 7)),
    op("avg_pool2d_global", lambda x: pb.avg_pool2d(x, (4, 6), stride=1),
       lambda x: F.avg_pool2d(x, (4, 6), stride=1), (2, 9, 4, 6)),
]



# ---------------------------------------------------------------- edges: ties, saturation, 0-d


EDGE_ROWS = [
    # Ties: max shares the gradient equally among tied maxima (as torch.amax), maximum and
    # minimum split it 1/2 and 1/2, clip passes it on the closed interval, pools take the first.
    op("max_all_with_ties", pb.max, _amax, (3, 4), domain=few_values, order=1),
    op("max_axis_with_ties", lambda x: pb.max(x, axis=-1, keepdims=True),
       lambda x: _amax(x, -1, True), (4, 5), domain=few_values, order=1),
    op("maximum_with_ties", pb.maximum, torch.maximum, (3, 1), (1, 4), domain=few_values,
       order=1),
    op("minimum_with_ties", pb.minimum, torch.minimum, (3, 4), (3, 4), domain=few_values,
       order=1),
    op("maximum_scalar_tie", lambda x: pb.maximum(x, 1.0), lambda x: torch.maximum(x, t(1.0)),
       (3, 4), domain=few_values, order=1),
    op("clip_on_bounds", lambda x: pb.clip(x, CLIP_LO, CLIP_HI),
       lambda x: torch.clamp(x, CLIP_LO, CLIP_HI), (4, 5), domain=on_clip_bounds, order=1),
    op("max_pool2d_with_ties", lambda x: pb.max_pool2d(x, 2, stride=1),
       lambda x: F.max_pool2d(x, 2, stride=1), (1, 2, 4, 4), domain=few_values, order=1),
    op("max_pool2d_tiling_with_ties", lambda x: pb.max_pool2d(x, 2),
       lambda x: F.max_pool2d(x, 2), (2, 2, 5, 7), domain=few_values, order=1),
    op("max_pool2d_dilated_with_ties", lambda x: pb.max_pool2d(x, 2, 1, 1, dilation=2),
       lambda x: F.max_pool2d(x, 2, 1, 1, dilation=2), (1, 2, 5, 5), domain=few_values,
       order=1),
    # Saturation: large |x| must not overflow.
    *(op(f"{name}_wide_inputs", f, g, (4, 6), domain=wide) for name, f, g, _ in UNARY
      if name in ("sigmoid", "tanh", "silu", "softplus", "gelu", "gelu_tanh")),
    op("softmax_wide_logits", pb.softmax, lambda x: torch.softmax(x, dim=-1), (4, 6),
       domain=wide),
    op("log_softmax_wide_logits", lambda x: pb.log_softmax(x, axis=0),
       lambda x: torch.log_softmax(x, dim=0), (4, 6), domain=wide),
    # 0-d operands, and Python ints as operands.
    op("exp_zero_dim", pb.exp, torch.exp, ()),
    op("sqrt_zero_dim", pb.sqrt, torch.sqrt, (), domain=positive),
    op("tanh_zero_dim", pb.tanh, torch.tanh, ()),
    op("sigmoid_zero_dim", pb.sigmoid, torch.sigmoid, ()),
    op("mul_zero_dim_with_matrix", pb.mul, torch.mul, (), (3, 4)),
    op("sum_zero_dim", pb.sum, torch.sum, ()),
    op("max_zero_dim", pb.max, _amax, ()),
    op("max_zero_dim_keepdims", lambda x: pb.max(x, keepdims=True),
       lambda x: x.amax(dim=(), keepdim=True), ()),
    op("mul_python_int", lambda x: x * 2, lambda x: x * 2, (3, 4)),
    op("rsub_python_int", lambda x: 3 - x, lambda x: 3 - x, (3, 4)),
    op("pow_python_int_exponent", lambda x: x ** 2, lambda x: x ** 2, (3, 4)),
    op("rpow_python_int_base", lambda x: 2 ** x, lambda x: 2 ** x, (3, 4)),
    # More indexing and joining.
    op("getitem_negative_int_array", lambda x: x[np.array([-1, 0, -1])],
       lambda x: x[torch.tensor([-1, 0, -1])], (4, 3)),
    op("getitem_int_array_and_slice", lambda x: x[np.array([0, 2]), 1:],
       lambda x: x[torch.tensor([0, 2]), 1:], (3, 4)),
    op("stack_negative_axis", lambda a, b: pb.stack([a, b], axis=-1),
       lambda a, b: torch.stack([a, b], dim=-1), (2, 3), (2, 3)),
    op("where_both_branches_broadcast", lambda a, b: pb.where(pb.tensor(COND_FULL), a, b),
       lambda a, b: torch.where(torch.tensor(COND_FULL), a, b), (3, 1), (1, 4)),
    op("mean_negative_axes_tuple", lambda x: pb.mean(x, axis=(-1, 0)),
       lambda x: x.mean(dim=(-1, 0)), (2, 3, 4)),
]


# ---------------------------------------------------------------- logsumexp, cumsum, sin, cos


def _logsumexp(x: torch.Tensor, dim: object = None, keepdim: bool = False) -> torch.Tensor:
    """torch.logsumexp, whose dim has no None: every axis is all of them."""
    return torch.logsumexp(x, dim=tuple(range(x.ndim)) if dim is None else dim, keepdim=keepdim)


# Not in UNARY, which the random-graph test draws from: they would add a third to its time
# (Numba compiling more fused chains) for code paths the rows here already take.
SCAN_AND_LOGSUMEXP_ROWS = [
    op("sin", pb.sin, torch.sin, (3, 4)),
    op("cos", pb.cos, torch.cos, (3, 4)),
    op("sin_wide_inputs", pb.sin, torch.sin, (4, 6), domain=wide),
    op("logsumexp_all", pb.logsumexp, _logsumexp, (3, 4)),
    op("logsumexp_axis", lambda x: pb.logsumexp(x, axis=1), lambda x: _logsumexp(x, 1),
       (2, 3, 4)),
    op("logsumexp_negative_axis_keepdims", lambda x: x.logsumexp(-1, keepdims=True),
       lambda x: x.logsumexp(-1, keepdim=True), (3, 5)),
    op("logsumexp_axes_tuple", lambda x: pb.logsumexp(x, axis=(0, 2)),
       lambda x: _logsumexp(x, (0, 2)), (2, 3, 4)),
    # Without the max shift e**x overflows float32 past 88.
    op("logsumexp_wide_inputs", lambda x: pb.logsumexp(x, axis=0), lambda x: _logsumexp(x, 0),
       (4, 6), domain=wide),
    op("logsumexp_zero_dim", pb.logsumexp, _logsumexp, ()),
    op("cumsum_axis_0", lambda x: pb.cumsum(x, 0), lambda x: torch.cumsum(x, 0), (3, 4)),
    op("cumsum_axis_1", lambda x: pb.cumsum(x, 1), lambda x: torch.cumsum(x, 1), (2, 3, 4)),
    op("cumsum_negative_axis_method", lambda x: x.cumsum(-1), lambda x: x.cumsum(-1),
       (2, 3, 5)),
    op("cumsum_zero_dim", lambda x: pb.cumsum(x, 0), lambda x: torch.cumsum(x, 0), ()),
    op("sin_zero_dim", pb.sin, torch.sin, ()),
    op("cos_method_broadcast_into_mul", lambda x, y: x.cos() * y, lambda x, y: x.cos() * y,
       (3, 1), (4,)),
]


# ---------------------------------------------------------------- the tensor API of today's models


def with_zeros(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Away from 0 except: one zero in row 0, two in row 1 (a product's gradient there)."""
    x = nonzero(rng, shape)
    x[0, 1] = 0.0
    x[1, :2] = 0.0
    return x


def zero_row(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """Row 0 all zeros: a norm of 0, whose gradient PyTorch makes 0."""
    x = rng.standard_normal(shape)
    x[0] = 0.0
    return x


MASK = torch.tensor(COND_COL)


def _split_product(split: Callable, x: object) -> object:
    a, b = split(x)
    return b * a


TENSOR_API_ROWS = [
    op("min_axis", lambda x: pb.min(x, axis=1), lambda x: x.amin(dim=1), (2, 3, 4),
       domain=distinct),
    op("min_method_axes_keepdims", lambda x: x.min(axis=(0, 2), keepdims=True),
       lambda x: x.amin(dim=(0, 2), keepdim=True), (2, 3, 4), domain=distinct),
    op("min_all_with_ties", pb.min, lambda x: x.amin(), (3, 4), domain=few_values, order=1),
    op("prod_axis", lambda x: pb.prod(x, axis=1), lambda x: x.prod(dim=1), (3, 4),
       domain=nonzero),
    op("prod_all_method", lambda x: x.prod(), lambda x: x.prod(), (2, 3), domain=nonzero),
    op("prod_with_zeros", lambda x: pb.prod(x, axis=1, keepdims=True),
       lambda x: x.prod(dim=1, keepdim=True), (3, 4), domain=with_zeros, order=1),
    op("var_axis", lambda x: pb.var(x, axis=1), lambda x: x.var(dim=1), (3, 5)),
    op("var_population_keepdims", lambda x: pb.var(x, keepdims=True, correction=0),
       lambda x: x.var(dim=None, correction=0, keepdim=True), (3, 4)),
    op("std_method_axes", lambda x: x.std((0, 2)), lambda x: x.std(dim=(0, 2)), (2, 3, 4)),
    op("norm_frobenius", pb.norm, torch.linalg.vector_norm, (3, 4)),
    op("norm_p1_axis", lambda x: pb.norm(x, 1, axis=1),
       lambda x: torch.linalg.vector_norm(x, 1, dim=1), (3, 4), domain=nonzero),
    op("norm_p3_keepdims_method", lambda x: x.norm(3, axis=-1, keepdims=True),
       lambda x: torch.linalg.vector_norm(x, 3, dim=-1, keepdim=True), (3, 4)),
    op("norm_inf_axis_0", lambda x: pb.norm(x, float("inf"), axis=0),
       lambda x: torch.linalg.vector_norm(x, float("inf"), dim=0), (3, 4), domain=distinct),
    op("norm_of_a_zero_row", lambda x: pb.norm(x, axis=1),
       lambda x: torch.linalg.vector_norm(x, dim=1), (3, 4), domain=zero_row, order=1),
    op("sort_values", lambda x: pb.sort(x)[0], lambda x: torch.sort(x)[0], (3, 5),
       domain=distinct),
    op("sort_descending_axis_0_method", lambda x: x.sort(axis=0, descending=True)[0],
       lambda x: x.sort(dim=0, descending=True)[0], (4, 3), domain=distinct),
    op("topk_values", lambda x: pb.topk(x, 2)[0], lambda x: torch.topk(x, 2)[0], (3, 5),
       domain=distinct),
    op("topk_smallest_axis_0_method", lambda x: x.topk(2, axis=0, largest=False)[0],
       lambda x: x.topk(2, dim=0, largest=False)[0], (4, 3), domain=distinct),
    op("einsum_matmul", lambda a, b: pb.einsum("ij,jk->ik", a, b),
       lambda a, b: torch.einsum("ij,jk->ik", a, b), (3, 4), (4, 5), sums=True),
    op("einsum_batched_matmul", lambda a, b: pb.einsum("bij,bjk->bik", a, b),
       lambda a, b: torch.einsum("bij,bjk->bik", a, b), (2, 3, 4), (2, 4, 5), sums=True),
    op("einsum_outer_implicit", lambda a, b: pb.einsum("i,j", a, b),
       lambda a, b: torch.einsum("i,j", a, b), (3,), (4,)),
    op("einsum_attention_scores", lambda q, k: pb.einsum("bhqd,bhkd->bhqk", q, k),
       lambda q, k: torch.einsum("bhqd,bhkd->bhqk", q, k), (2, 2, 3, 4), (2, 2, 5, 4),
       sums=True),
    op("einsum_transpose", lambda x: pb.einsum("ijk->kij", x),
       lambda x: torch.einsum("ijk->kij", x), (2, 3, 4)),
    op("einsum_sum", lambda x: pb.einsum("ijk->j", x), lambda x: torch.einsum("ijk->j", x),
       (2, 3, 4), sums=True),
    op("einsum_three_operands_ellipsis", lambda a, w, v: pb.einsum("...i,ij,j->...", a, w, v),
       lambda a, w, v: torch.einsum("...i,ij,j->...", a, w, v), (2, 3), (3, 4), (4,),
       sums=True),
    op("einsum_diagonal", lambda x: pb.einsum("bii->bi", x),
       lambda x: torch.einsum("bii->bi", x), (2, 3, 3)),
    op("split_sizes_product", lambda x: _split_product(lambda y: pb.split(y, [1, 3], 1), x),
       lambda x: _split_product(lambda y: torch.split(y, [1, 3], 1), x), (3, 4)),
    op("chunk_method_product", lambda x: _split_product(lambda y: y.chunk(2), x),
       lambda x: _split_product(lambda y: y.chunk(2), x), (4, 3)),
    op("unbind_axis_1", lambda x: pb.unbind(x, 1)[0] * pb.unbind(x, 1)[2],
       lambda x: torch.unbind(x, 1)[0] * torch.unbind(x, 1)[2], (2, 3)),
    op("squeeze_unsqueeze_permute_flatten",
       lambda x: pb.flatten(pb.permute(pb.unsqueeze(pb.squeeze(x, 1), 0), 0, 3, 1, 2), 1),
       lambda x: x.squeeze(1).unsqueeze(0).permute(0, 3, 1, 2).flatten(1), (2, 1, 3, 4)),
    op("view_permute_methods", lambda x: x.squeeze().permute((1, 0)).view(-1, 2),
       lambda x: x.squeeze().permute((1, 0)).reshape(-1, 2), (1, 3, 4)),
    op("tril_batched_k1", lambda x: pb.tril(x, 1), lambda x: torch.tril(x, 1), (2, 3, 4)),
    op("triu_method_negative_k", lambda x: x.triu(-1), lambda x: x.triu(-1), (4, 3)),
    op("masked_fill_broadcast_mask", lambda x: pb.masked_fill(x, pb.tensor(COND_COL), -2.0),
       lambda x: x.masked_fill(MASK, -2.0), (3, 4)),
    op("masked_fill_tensor_value_method", lambda x, v: x.masked_fill(pb.tensor(COND_COL), v),
       lambda x, v: x.masked_fill(MASK, v), (3, 4), ()),
]


def _torch_lstm_sequence(xp: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
                         w: torch.Tensor) -> torch.Tensor:
    """pb.ops.lstm_sequence's states (h and c per step), step by step."""
    steps = []
    for t in range(xp.shape[0]):
        i, f, g, o = (xp[t] + h @ w.T).chunk(4, -1)
        i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
        c = f * c + i * g
        h = o * c.tanh()
        steps.append(torch.stack([h, c]))
    return torch.stack(steps, 1)


def _torch_gru_sequence(xp: torch.Tensor, h: torch.Tensor, w: torch.Tensor,
                        b: torch.Tensor) -> torch.Tensor:
    """pb.ops.gru_sequence's states (h per step)."""
    steps = []
    for t in range(xp.shape[0]):
        ar, az, an = xp[t].chunk(3, -1)
        hr, hz, hn = (h @ w.T + b).chunk(3, -1)
        r, z = (ar + hr).sigmoid(), (az + hz).sigmoid()
        n = (an + r * hn).tanh()
        h = (1 - z) * n + z * h
        steps.append(h)
    return torch.stack(steps)


RECURRENT_ROWS = [
    op("lstm_sequence", pb.ops.lstm_sequence, _torch_lstm_sequence, (3, 2, 8), (2, 2), (2, 2),
       (8, 2), sums=True),
    op("gru_sequence", pb.ops.gru_sequence, _torch_gru_sequence, (3, 2, 9), (2, 3), (9, 3),
       (9,), sums=True),
]


# ---------------------------------------------------------------- batch norm


def _batch_norm_eval_by_hand(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor,
                             w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """F.batch_norm in eval mode, in ops torch differentiates in the running statistics
    too (its batch_norm does not)."""
    column = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean.reshape(column)) / torch.sqrt(var.reshape(column) + 1e-5) * \
        w.reshape(column) + b.reshape(column)


BATCH_NORM_ROWS = [
    op("batch_norm_training_2d", lambda x, w, b: pb.batch_norm(x, None, None, w, b, True),
       lambda x, w, b: F.batch_norm(x, None, None, w, b, True), (4, 3), (3,), (3,),
       sums=True),
    op("batch_norm_training_4d_eps_no_affine",
       lambda x: pb.batch_norm(x, None, None, training=True, eps=0.1),
       lambda x: F.batch_norm(x, None, None, training=True, eps=0.1), (2, 3, 2, 3),
       sums=True),
    op("batch_norm_eval_3d", lambda x, m, v, w, b: pb.batch_norm(x, m, v, w, b),
       _batch_norm_eval_by_hand, (2, 3, 4), (3,), (3,), (3,), (3,),
       domain=(real, real, positive, real, real)),
    # The statistics the running ones are updated with: (2, C), mean and biased variance.
    op("batch_norm_statistics_4d", batch_norm_statistics_p.bind,
       lambda x: torch.stack(torch.var_mean(x, (0, 2, 3), correction=0)[::-1]), (3, 2, 2, 3)),
    op("batch_norm_statistics_2d", batch_norm_statistics_p.bind,
       lambda x: torch.stack(torch.var_mean(x, 0, correction=0)[::-1]), (4, 3)),
]


# ---------------------------------------------------------------- attention


def _sdpa(**kw: object) -> tuple[Callable, Callable]:
    """pb's and torch's scaled_dot_product_attention with the same keyword arguments."""
    return (lambda q, k, v: pb.scaled_dot_product_attention(q, k, v, **kw),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **{
                key: torch.tensor(val) if isinstance(val, np.ndarray) else val
                for key, val in kw.items()}))


KEEP_ROWS = np.array([[True, False, True, True, False], [False] * 5, [True] * 5])

ATTENTION_ROWS = [
    op("sdpa", *_sdpa(), (2, 3, 4), (2, 5, 4), (2, 5, 3), sums=True),
    op("sdpa_causal_scale", *_sdpa(is_causal=True, scale=0.6), (2, 2, 4, 3), (2, 2, 4, 3),
       (2, 2, 4, 2), sums=True),
    op("sdpa_causal_more_queries_than_keys", *_sdpa(is_causal=True), (5, 3), (4, 3), (4, 2),
       sums=True),
    # A bool mask: True takes part; the middle row masks every key (zeros, as PyTorch).
    op("sdpa_bool_mask", *_sdpa(attn_mask=KEEP_ROWS), (2, 3, 4), (2, 5, 4), (2, 5, 3),
       sums=True),
    op("sdpa_float_mask_broadcast", lambda q, k, v, m: pb.scaled_dot_product_attention(
        q, k, v, m), lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m),
       (2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3), (2, 1, 3, 5), sums=True),
    op("sdpa_broadcast_batch_dims", *_sdpa(), (2, 1, 3, 4), (3, 5, 4), (1, 3, 5, 2),
       sums=True),
]


ROWS: list[OpSpec] = [
    *(op(name, f, g, (3, 4), domain=d) for name, f, g, d in UNARY),
    *_binary_rows(),
    *OPERATOR_ROWS,
    *OTHER_ELEMENTWISE,
    *MATMUL_ROWS,
    *REDUCTION_ROWS,
    *SHAPE_ROWS,
    *GATHER_ROWS,
    *CONV_ROWS,
    *EDGE_ROWS,
    *SCAN_AND_LOGSUMEXP_ROWS,
    *TENSOR_API_ROWS,
    *RECURRENT_ROWS,
    *BATCH_NORM_ROWS,
    *ATTENTION_ROWS,
]

SECOND_ORDER_ROWS = [row for row in ROWS if row.order >= 2]


# ---------------------------------------------------------------- large rows, threaded backend


BIG = (200, 256)  # 51200 elements: above ThreadedCpuBackend's splitting threshold

THREADED_ROWS: list[OpSpec] = [
    *(op(f"threaded_{name}", f, g, BIG, domain=d) for name, f, g, d in UNARY
      if not name.endswith("_operator")),
    op("threaded_add_row_broadcast", pb.add, torch.add, BIG, (BIG[1],)),
    op("threaded_sub_column_broadcast", pb.sub, torch.sub, (BIG[0], 1), BIG),
    op("threaded_mul", pb.mul, torch.mul, BIG, BIG),
    op("threaded_div", pb.div, torch.div, BIG, BIG, domain=(real, nonzero)),
    op("threaded_pow", pb.pow, torch.pow, BIG, BIG, domain=(positive, real)),
    op("threaded_mul_scalar", lambda x: x * 2.5, lambda x: x * 2.5, BIG),
    op("threaded_maximum", pb.maximum, torch.maximum, BIG, BIG),
    op("threaded_minimum", pb.minimum, torch.minimum, BIG, (BIG[1],)),
    op("threaded_clip", lambda x: pb.clip(x, CLIP_LO, CLIP_HI),
       lambda x: torch.clamp(x, CLIP_LO, CLIP_HI), BIG, domain=off_clip_bounds),
    op("threaded_softmax_last_axis", pb.softmax, lambda x: torch.softmax(x, dim=-1), BIG),
    op("threaded_softmax_axis_0", lambda x: pb.softmax(x, axis=0),
       lambda x: torch.softmax(x, dim=0), BIG),
    op("threaded_log_softmax_last_axis", pb.log_softmax,
       lambda x: torch.log_softmax(x, dim=-1), BIG),
    op("threaded_sum_all", pb.sum, torch.sum, BIG, sums=True),
    op("threaded_sum_axis_0", lambda x: pb.sum(x, axis=0), lambda x: x.sum(dim=0), BIG,
       sums=True),
    op("threaded_sum_axis_1_keepdims", lambda x: pb.sum(x, axis=1, keepdims=True),
       lambda x: x.sum(dim=1, keepdim=True), BIG, sums=True),
    op("threaded_mean_axis_1", lambda x: pb.mean(x, axis=1), lambda x: x.mean(dim=1), BIG,
       sums=True),
    op("threaded_sin", pb.sin, torch.sin, BIG),
    op("threaded_cos", pb.cos, torch.cos, BIG),
    op("threaded_logsumexp_axis_0", lambda x: pb.logsumexp(x, axis=0),
       lambda x: _logsumexp(x, 0), BIG, sums=True),
    op("threaded_cumsum_axis_1", lambda x: pb.cumsum(x, 1), lambda x: torch.cumsum(x, 1), BIG,
       sums=True),
    op("threaded_cumsum_axis_0", lambda x: pb.cumsum(x, 0), lambda x: torch.cumsum(x, 0), BIG,
       sums=True),
]
