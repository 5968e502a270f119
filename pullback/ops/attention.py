"""scaled_dot_product_attention: softmax(q k^T * scale + mask) v as one primitive.

Forward and backward are fused: each walks the queries in blocks of rows, so that the
scores of one block (all heads together, a bounded number of elements) are what is
materialized at a time, and nothing of size (T, T) is kept for backward. The node
keeps q, k and v only: backward recomputes each block's probabilities from q and k
(their row normalizers, FlashAttention's logsumexp, come out of the same pass; a
block holds whole rows, so neither they nor the output need keeping), and the
softmax's backward kernel takes them to the scores' gradient in one pass. A causal
mask skips the keys past a block's last query. The JVP rule is written in primitives,
so forward mode and higher orders work as for every other op.

Masks are operands: an additive float `bias` (a bool mask becomes 0 / -inf), and a
dropout `keep` mask (0 or 1/(1-p), drawn by `dropout_mask`), which the backward reads
as saved, so gradients see the very mask the forward used. Rows every key is masked
from give zeros, as PyTorch's scaled_dot_product_attention gives them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import numpy as np

from ..ad import Zero, defjvp_full, defvjp
from ..errors import KernelError
from .checks import declare_check, inputs, normal
from .elementwise import add, astype, equal, mul, sub, where
from .linalg import matmul
from .loss import dropout_mask
from .reduce import max as reduce_max
from .reduce import softmax
from .reduce import sum as reduce_sum
from .registry import declare, dtype_of, is_float, shape_of
from .shape import reshape, swap_last

#: The ops `import pullback as pb` offers as `pb.<name>` (and `pullback.ops` too).
__all__ = ["scaled_dot_product_attention"]

OP = "scaled_dot_product_attention"
# Scores per query block, all heads together (1 MiB of float32): a block's scores,
# probabilities and their gradient stay in cache while both matmuls read them.
BLOCK_ELEMENTS = 1 << 18
NEG_INF = -math.inf

# Where dropout draws when the caller names no generator: the tensor layer installs
# its global one (`pb.manual_seed` seeds it); see `draw_from`.
_GENERATOR: list[Callable[[], np.random.Generator]] = []


def draw_from(generator: Callable[[], np.random.Generator]) -> None:
    """Name the generator dropout draws from by default (`generator()` returns it)."""
    _GENERATOR[:] = [generator]


# ---------------------------------------------------------------- the primitive


def _shape(q: Any, k: Any, v: Any, bias: Any, keep: Any, scale: float, causal: bool) -> tuple:
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


def _impl(backend: Any, q: Any, k: Any, v: Any, bias: Any, keep: Any, scale: float,
          causal: bool) -> Any:
    _shape(q, k, v, bias, keep, scale, causal)  # eager calls skip shape rules
    return _forward(backend, q, k, v, bias, keep, scale, causal)


attention_p = declare(OP, _impl, _shape, saves_inputs=True, aliasing="fresh")


# ---------------------------------------------------------------- the fused kernels


class _Blocks:
    """How one call walks its queries: row blocks, the keys each block sees, and the
    slices of the operands (masks broadcast along an axis are not sliced there)."""

    def __init__(self, backend: Any, q: Any, k: Any, bias: Any, causal: bool):
        self.backend, self.causal = backend, causal
        self.length, self.keys = q.shape[-2], k.shape[-2]
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        rows = BLOCK_ELEMENTS // max(1, math.prod(batch) * self.keys)
        rows = max(1, min(self.length, rows))
        self.ranges = [(i, min(i + rows, self.length)) for i in range(0, self.length, rows)]
        self.dead = None  # rows of bias that mask every key: their output is zero
        if bias is not None:
            dead = backend.equal(backend.reduce_max(bias, (bias.ndim - 1,), True), NEG_INF)
            self.dead = dead if np.any(backend.to_numpy(dead)) else None

    def seen(self, stop: int) -> int:
        """How many keys a block of queries ending at `stop` attends to."""
        return min(self.keys, stop) if self.causal else self.keys

    def rows(self, x: Any, start: int, stop: int, seen: int | None = None) -> Any:
        """x's rows start:stop along the query axis (and its first `seen` keys)."""
        if x is None:
            return None
        index = (Ellipsis,
                 slice(start, stop) if x.shape[-2] != 1 else slice(None),
                 slice(0, seen) if seen is not None and x.shape[-1] != 1 else slice(None))
        return x if index[1:] == (slice(None), slice(None)) else self.backend.getitem(x, index)

    def keys_of(self, x: Any, seen: int) -> Any:
        """x's first `seen` rows along the key axis (k and v)."""
        if seen == self.keys:
            return x
        return self.backend.getitem(x, (Ellipsis, slice(0, seen), slice(None)))

    def probabilities(self, scaled_q: Any, k: Any, bias: Any, start: int, stop: int) -> Any:
        """softmax(q k^T * scale + bias) for the queries start:stop, over the keys they see."""
        be = self.backend
        seen = self.seen(stop)
        scores = be.matmul(self.rows(scaled_q, start, stop), _swap(be, self.keys_of(k, seen)))
        if bias is not None:
            scores = be.add(scores, self.rows(bias, start, stop))
        if self.causal and seen > start + 1:  # keys past each query are masked
            later = be.greater(be.arange(0, seen, 1, "int64"),
                               be.reshape(be.arange(start, stop, 1, "int64"), (stop - start, 1)))
            scores = be.where(later, NEG_INF, scores)
        p = be.softmax(scores, -1)
        if self.dead is not None:
            p = be.where(self.rows(self.dead, start, stop), 0.0, p)
        return p


def _swap(backend: Any, x: Any) -> Any:
    return backend.transpose(x, tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2))


def _forward(backend: Any, q: Any, k: Any, v: Any, bias: Any, keep: Any, scale: float,
             causal: bool) -> Any:
    be = backend
    if _empty(q, k):  # no queries, or no keys: zeros, as PyTorch gives
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        return be.zeros(batch + (q.shape[-2], v.shape[-1]), q.dtype)
    blocks = _Blocks(be, q, k, bias, causal)
    scaled_q = be.mul(q, scale)  # (L, E) once, not each (L, S) block of scores
    outputs = []
    for start, stop in blocks.ranges:
        seen = blocks.seen(stop)
        p = blocks.probabilities(scaled_q, k, bias, start, stop)
        if keep is not None:
            p = be.mul(p, blocks.rows(keep, start, stop, seen))
        outputs.append(be.matmul(p, blocks.keys_of(v, seen)))
    return outputs[0] if len(outputs) == 1 else be.concatenate(outputs, -2)


def _backward(backend: Any, upstream: Any, q: Any, k: Any, v: Any, bias: Any, keep: Any,
              scale: float, causal: bool, bias_grad: bool) -> tuple:
    """(dq, dk, dv, dbias or None): the scores' gradient is softmax's backward of dp,
    p * (dp - rowsum(p * dp)), dp being upstream v^T (times the dropout mask)."""
    be = backend
    if _empty(q, k):  # the output is empty or constant: every gradient is zero
        return tuple(None if x is None else be.zeros(x.shape, x.dtype) for x in (q, k, v)) + \
            ((be.zeros(bias.shape, bias.dtype) if bias_grad else None),)
    blocks = _Blocks(be, q, k, bias, causal)
    scaled_q = be.mul(q, scale)
    dq_parts, dbias_parts, dk_parts, dv_parts = [], [], [], []
    for start, stop in blocks.ranges:
        seen = blocks.seen(stop)
        p = blocks.probabilities(scaled_q, k, bias, start, stop)
        g = blocks.rows(upstream, start, stop)
        k_seen, v_seen = blocks.keys_of(k, seen), blocks.keys_of(v, seen)
        kept = p if keep is None else be.mul(p, blocks.rows(keep, start, stop, seen))
        dv_parts.append(be.matmul(_swap(be, kept), g))
        dp = be.matmul(g, _swap(be, v_seen))
        if keep is not None:
            dp = be.mul(dp, blocks.rows(keep, start, stop, seen))
        ds = be.softmax_backward(dp, p, -1)  # BackwardOps': a vjp runs on such backends
        if bias_grad:
            dbias_parts.append(be.sum_to_shape(ds, _block_shape(bias, ds.ndim, start, stop)))
        dq_parts.append(be.matmul(ds, k_seen))
        dk_parts.append(be.matmul(_swap(be, ds), blocks.rows(scaled_q, start, stop)))
    dk, dv = _sum_keys(be, dk_parts, blocks.keys), _sum_keys(be, dv_parts, blocks.keys)
    dq = be.mul(dq_parts[0] if len(dq_parts) == 1 else be.concatenate(dq_parts, -2), scale)
    dbias = None
    if bias_grad:
        along_rows = bias.shape[-2] != 1 and len(dbias_parts) > 1
        dbias = be.concatenate(dbias_parts, -2) if along_rows else _total(be, dbias_parts)
        dbias = be.reshape(dbias, bias.shape)
    return (be.sum_to_shape(dq, q.shape), be.sum_to_shape(dk, k.shape),
            be.sum_to_shape(dv, v.shape), dbias)


def _empty(q: Any, k: Any) -> bool:
    return q.shape[-2] == 0 or k.shape[-2] == 0


def _block_shape(bias: Any, ndim: int, start: int, stop: int) -> tuple:
    shape = (1,) * (ndim - bias.ndim) + tuple(bias.shape)
    return shape[:-2] + ((stop - start) if shape[-2] != 1 else 1, shape[-1])


def _sum_keys(backend: Any, parts: list, keys: int) -> Any:
    """The sum of `parts` in their order, each covering the first part.shape[-2] of `keys`
    rows (a causal block's keys), zero past them: summed chunk of keys by chunk of keys,
    so that no part is padded with zeros (three passes over the whole per block)."""
    edges = sorted({part.shape[-2] for part in parts} | {0})
    chunks = []
    for low, high in pairwise(edges):
        total = None
        for part in parts:
            if part.shape[-2] < high:
                continue
            if (low, high) != (0, part.shape[-2]):
                part = backend.getitem(part, (Ellipsis, slice(low, high), slice(None)))
            total = part if total is None else backend.add(total, part)
        chunks.append(total)
    if edges[-1] < keys:  # keys no query sees (causal, fewer queries than keys)
        first = parts[0]
        chunks.append(backend.zeros(first.shape[:-2] + (keys - edges[-1], first.shape[-1]),
                                    first.dtype))
    return chunks[0] if len(chunks) == 1 else backend.concatenate(chunks, -2)


def _total(backend: Any, parts: list) -> Any:
    total = parts[0]
    for part in parts[1:]:
        total = backend.add(total, part)
    return total


def _vjp(be: Any, g: Any, node: Any) -> tuple:
    q, k, v, bias, keep = node.inputs
    bias_grad = bias is not None and node.parents[3] is not None
    params = node.params
    dq, dk, dv, dbias = _backward(be, g, q, k, v, bias, keep, params["scale"],
                                  params["causal"], bias_grad)
    return dq, dk, dv, dbias, None


defvjp(attention_p, _vjp)


# ---------------------------------------------------------------- the rule, in primitives


def _probabilities(q: Any, k: Any, bias: Any, scale: float, causal: bool) -> Any:
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


def _jvp(tangents: tuple, out: Any, inputs: tuple, scale: float, causal: bool) -> Any:
    q, k, v, bias, keep = inputs
    tq, tk, tv, tbias, _ = tangents  # the dropout mask is drawn, never differentiated
    p = _probabilities(q, k, bias, scale, causal)
    t_scores = None
    for active, term in ((_active(tq), lambda: matmul(mul(tq, scale), swap_last(k))),
                         (_active(tk), lambda: matmul(mul(q, scale), swap_last(tk))),
                         (_active(tbias), lambda: tbias)):
        if active:
            t_scores = term() if t_scores is None else add(t_scores, term())
    result = None
    if t_scores is not None:
        tp = mul(p, sub(t_scores, reduce_sum(mul(p, t_scores), -1, True)))
        result = matmul(tp if keep is None else mul(tp, keep), v)
    if _active(tv):
        term = matmul(p if keep is None else mul(p, keep), tv)
        result = term if result is None else add(result, term)
    return result


defjvp_full(attention_p, _jvp)


# ---------------------------------------------------------------- the public op


def scaled_dot_product_attention(
    query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
    is_causal: bool = False, scale: float | None = None, *,
    generator: Callable[[], np.random.Generator] | None = None,
) -> Any:
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


def _as_bias(mask: Any, dtype: Any, operands: tuple) -> Any:
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
