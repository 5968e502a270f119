"""scaled_dot_product_attention: softmax(q k^T * scale + mask) v as one primitive.

Forward and backward are fused backend ops (`pullback.backend.attention`): each walks
the queries in blocks of rows. The node keeps q, k, v and the output. Where a backward
will follow (`saving_impl`: an eager call recorded for one, an active step of a
training plan), the CPU forward keeps each block's probabilities beside its output
(the scores' size, a causal block's seen keys only; up to `KEEP_RATIO` times the
memory of q, k, v and the output), and the backward reads them there instead of
computing them again; elsewhere (inference, masks, long contexts, a copied output)
nothing of size (T, T) is kept, and the backward recomputes them from q and k. The
JVP rule is written in primitives, so forward mode and higher orders work as for
every other op.

Masks are operands: an additive float `bias` (a bool mask becomes 0 / -inf), and a
dropout `keep` mask (0 or 1/(1-p), drawn by `dropout_mask`), which the backward reads
as saved, so gradients see the very mask the forward used. Rows every key is masked
from give zeros, as PyTorch's scaled_dot_product_attention gives them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ad import Zero, defjvp_full, defvjp
from ..backend.attention import attention_ops, kept_elements
from ..backend.backward_ops import BackwardOps
from ..backend.base import Backend
from ..errors import KernelError
from .checks import declare_check, inputs, normal
from .elementwise import add, astype, equal, mul, sub, where
from .hints import TensorLike
from .linalg import matmul
from .loss import dropout_mask
from .reduce import max as reduce_max
from .reduce import softmax
from .reduce import sum as reduce_sum
from .registry import declare, dtype_of, is_float, shape_of
from .shape import reshape, swap_last

if TYPE_CHECKING:
    from ..tensor import Tensor

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["scaled_dot_product_attention"]

OP = "scaled_dot_product_attention"
NEG_INF = -math.inf

# Where dropout draws when the caller names no generator: the tensor layer installs
# its global one (`pb.manual_seed` seeds it); see `draw_from`.
_GENERATOR: list[Callable[[], np.random.Generator]] = []


def draw_from(generator: Callable[[], np.random.Generator]) -> None:
    """Name the generator dropout draws from by default (`generator()` returns it)."""
    _GENERATOR[:] = [generator]


# ---------------------------------------------------------------- the primitive


def _shape(q: Any, k: Any, v: Any, bias: Any, keep: Any, scale: float, causal: bool
           ) -> tuple[Any, ...]:
    """q (..., L, E), k (..., S, E), v (..., S, Ev), batch dimensions broadcast; bias and
    keep None or broadcastable to the scores (..., L, S) without widening them."""
    operands = tuple(x for x in (q, k, v, bias, keep) if x is not None)
    sq, sk, sv = shape_of(q), shape_of(k), shape_of(v)
    dtype = dtype_of(q)
    if not is_float(dtype) or any(dtype_of(x) != dtype for x in operands):
        raise KernelError(OP, operands, "query, key, value and a float mask must share one "
                          "floating dtype")
    if min(len(sq), len(sk), len(sv)) < 2:
        raise KernelError(OP, operands, "query, key and value need (..., T, D) shapes")
    if causal and bias is not None:
        raise KernelError(OP, operands, "attn_mask and is_causal cannot both be given "
                          "(PyTorch refuses them too): put the causal mask into attn_mask")
    if sk[-1] != sq[-1]:
        raise KernelError(OP, operands, f"query and key embeddings differ: {sq[-1]} and "
                          f"{sk[-1]}")
    if sv[-2] != sk[-2]:
        raise KernelError(OP, operands, f"key and value lengths differ: {sk[-2]} and {sv[-2]}")
    try:
        batch = np.broadcast_shapes(sq[:-2], sk[:-2], sv[:-2])
    except ValueError:
        raise KernelError(OP, operands, "the batch dimensions of query, key and value cannot "
                          "be broadcast together") from None
    scores = batch + (sq[-2], sk[-2])
    for x in (bias, keep):
        shape = shape_of(x)
        if x is not None and (not 2 <= len(shape) <= len(scores) or any(
                d not in (1, t) for d, t in zip(shape[::-1], scores[::-1]))):
            raise KernelError(OP, operands, f"a mask of shape {shape} does not broadcast to "
                              f"the attention scores {scores}")
    return batch + (sq[-2], sv[-1]), dtype


def _impl(backend: Backend, q: Any, k: Any, v: Any, bias: Any, keep: Any, scale: float,
          causal: bool, for_backward: bool = False) -> Any:
    _shape(q, k, v, bias, keep, scale, causal)  # eager calls skip shape rules
    return attention_ops(backend).attention(q, k, v, bias, keep, scale, causal,
                                            for_backward=for_backward)


attention_p = declare(OP, _impl, _shape, saves_inputs=True, saves_output=True,
                      aliasing="fresh")
def _saving_bytes(q: Any, k: Any, v: Any, bias: Any, keep: Any, scale: float,
                  causal: bool) -> int:
    """The bytes of probabilities the CPU forward keeps beside its result (its blocks on
    BLAS's threads now), where it keeps them: unmasked, within KEEP_RATIO of q, k, v
    and the output (pullback.backend.attention)."""
    sq, sk, sv = shape_of(q), shape_of(k), shape_of(v)
    if bias is not None or keep is not None or sq[:-2] != sk[:-2] or sk[:-2] != sv[:-2]:
        return 0
    count = kept_elements(tuple(sq[:-2]), sq[-2], sk[-2], sq[-1], sv[-1], causal)
    return count * np.dtype(dtype_of(q)).itemsize


attention_p.saving_impl = partial(_impl, for_backward=True)
attention_p.saving_bytes = _saving_bytes


def _vjp(be: BackwardOps, g: Any, node: Any) -> tuple[Any, ...]:
    q, k, v, bias, keep = node.inputs
    bias_grad = bias is not None and node.parents[3] is not None
    params = node.params
    dq, dk, dv, dbias = attention_ops(be).attention_backward(
        g, q, k, v, bias, keep, params["scale"], params["causal"], bias_grad, node.output)
    return dq, dk, dv, dbias, None


defvjp(attention_p, _vjp)


# ---------------------------------------------------------------- the rule, in primitives


def _probabilities(q: Any, k: Any, bias: Any, scale: float, causal: bool) -> Tensor:
    """The attention weights, written in primitives (zero rows where bias masks all)."""
    scores = matmul(mul(q, scale), swap_last(k))
    length, keys = shape_of(q)[-2], shape_of(k)[-2]
    if not keys:
        return scores  # empty: the output is zeros, and so is its derivative
    if causal:
        later = np.triu(np.ones((length, keys), dtype=bool), 1)
        scores = where(later, NEG_INF, scores)
    if bias is None:
        return softmax(scores, -1)
    scores = add(scores, bias)
    # Rows with every key masked: their scores set to 0 first, so that no NaN reaches
    # a derivative through softmax, then their weights to 0.
    dead = equal(reduce_max(bias, -1, True), NEG_INF)
    return where(dead, 0.0, softmax(where(dead, 0.0, scores), -1))


def _active(tangent: Any) -> bool:
    return tangent is not None and type(tangent) is not Zero


def _jvp(tangents: tuple[Any, ...], out: Any, inputs: tuple[Any, ...], scale: float,
         causal: bool) -> Tensor | None:
    q, k, v, bias, keep = inputs
    tq, tk, tv, tbias, _ = tangents  # the dropout mask is drawn, never differentiated
    p = _probabilities(q, k, bias, scale, causal)
    t_scores: Tensor | None = None
    for active, term in ((_active(tq), lambda: matmul(mul(tq, scale), swap_last(k))),
                         (_active(tk), lambda: matmul(mul(q, scale), swap_last(tk))),
                         (_active(tbias), lambda: tbias)):
        if active:
            t_scores = term() if t_scores is None else add(t_scores, term())
    result: Tensor | None = None
    if t_scores is not None:
        tp = mul(p, sub(t_scores, reduce_sum(mul(p, t_scores), -1, True)))
        result = matmul(tp if keep is None else mul(tp, keep), v)
    if _active(tv):
        by_tv = matmul(p if keep is None else mul(p, keep), tv)
        result = by_tv if result is None else add(result, by_tv)
    return result


defjvp_full(attention_p, _jvp)


# ---------------------------------------------------------------- the public op


def scaled_dot_product_attention(
    query: TensorLike, key: TensorLike, value: TensorLike, attn_mask: TensorLike | None = None,
    dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, *,
    generator: Callable[[], np.random.Generator] | None = None,
) -> Tensor:
    """softmax(query key^T * scale + mask) value over (..., L, E), (..., S, E) and
    (..., S, Ev) operands, as torch.nn.functional.scaled_dot_product_attention: `scale`
    defaults to 1/sqrt(E); a bool `attn_mask` marks the keys that take part (True), a
    float one is added to the scores; `is_causal` lets query i see keys 0..i (not with
    `attn_mask`); `dropout_p` zeroes attention weights with that probability, drawn
    from `generator()` (pullback's global generator, `pb.manual_seed`, by default)."""
    operands = tuple(x for x in (query, key, value, attn_mask) if x is not None)
    if len(shape_of(query)) < 2 or len(shape_of(key)) < 2:
        raise KernelError(OP, operands, "query, key and value need (..., T, D) shapes")
    if not 0.0 <= dropout_p < 1.0:
        raise KernelError(OP, operands, f"dropout_p must be in [0, 1), not {dropout_p}")
    scale = 1.0 / math.sqrt(shape_of(query)[-1]) if scale is None else float(scale)
    bias = None if attn_mask is None else _as_bias(attn_mask, dtype_of(query), operands)
    keep = None
    if dropout_p > 0.0:
        scores = np.broadcast_shapes(shape_of(query)[:-2], shape_of(key)[:-2],
                                     shape_of(bias)[:-2] if bias is not None else ()) + \
            (shape_of(query)[-2], shape_of(key)[-2])
        # The mask op reads only its operand's shape: a broadcast zero holds no memory.
        shaped = np.broadcast_to(np.zeros((), dtype_of(query)), scores)
        keep = dropout_mask(shaped, float(dropout_p), generator or _GENERATOR[0])
    return attention_p.bind(query, key, value, bias, keep, scale=scale, causal=bool(is_causal))


def _as_bias(mask: Any, dtype: Any, operands: tuple[Any, ...]) -> Any:
    """A bool mask as 0 / -inf, a float one as it is, at least 2-D."""
    mask_dtype = dtype_of(mask)
    if str(mask_dtype) == "bool":
        mask = astype(where(mask, 0.0, NEG_INF), dtype)
    elif mask_dtype != dtype:
        raise KernelError(OP, operands, "attn_mask must be bool or have the query's dtype")
    shape = shape_of(mask)
    return mask if len(shape) >= 2 else reshape(mask, (1,) * (2 - len(shape)) + shape)


# ---------------------------------------------------------------- samples for `pullback check`

_CAUSAL_MASK = np.tril(np.ones((3, 4), dtype=bool))
declare_check(
    attention_p,
    lambda q, k, v, m: (scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.7),
                        scaled_dot_product_attention(q, k, v, _CAUSAL_MASK),
                        scaled_dot_product_attention(q, k, v, m)),
    inputs(normal(1, 3, 4), normal(1, 4, 4), normal(1, 4, 2), normal(3, 4)))
