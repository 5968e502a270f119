"""`AttentionOps`: scaled dot-product attention's fused forward and backward.

Both walk the queries in blocks of rows, so that the scores of one block (all heads
together, a bounded number of elements) are what is materialized at a time. The
backward recomputes each block's probabilities from q and k, and softmax's backward
takes them to the scores' gradient in one pass; `CpuAttentionOps`' forward, asked to
run for a backward (`for_backward`), keeps them instead beside its result (`_Kept`),
and its backward reads them there, sparing a product and a softmax per block (where
they take at most KEEP_RATIO times the memory of q, k, v and the result). A causal
mask skips the keys past a block's last query (query i sees keys 0..i). Masks arrive
as operands: an additive float `bias` (None, or broadcastable to the scores) and a
dropout `keep` mask (None, or 0 or 1/(1-p)). Rows every key of `bias` masks give
zeros, as PyTorch gives them.

The defaults are written in forward ops on `self`. `CpuAttentionOps` runs the unmasked
case (no bias, no dropout: a GPT's causal self-attention) in NumPy: key blocks and
output rows are views rather than copies, products write into them (`out=`), and the
causal mask is applied inside the softmax's pass (`kernels.rows.causal_softmax`)
rather than by a separate `where` over the scores, and so is the scale.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np

from pullback.backend import split
from pullback.backend.base import Array, Backend, Mixin
from pullback.kernels import rows as compiled_rows
from pullback.kernels.core import SUPPORTED_DTYPES

# Scores per query block, all heads together (1 MiB of float32): a block's scores,
# probabilities and their gradient stay in cache while both matmuls read them. For the
# GPT bench's causal heads ((16, 4, 128, 32), blocks of 32 queries) this was the fastest
# of 2**16..2**20 for CpuAttentionOps' forward + backward: larger blocks compute more of
# the masked triangle, smaller ones make BLAS products too small to run at speed.
# CpuAttentionOps counts it per part of the heads (`_by_heads`): split over two
# threads, the GPT bench's blocks of 64 queries (2**18 scores a thread) took its
# attention 1.5-1.8 ms a step less than blocks of 32 (paired, in one process).
BLOCK_ELEMENTS = 1 << 18
NEG_INF = -math.inf
# From this many multiply-adds (both products, unmasked) CpuAttentionOps splits the
# heads over BLAS's threads (`_by_heads`); the GPT bench's causal heads ((16, 4, 128,
# 32): 67M) took 23.5 ms a step on two threads against 41.5 on one. BLAS does not thread
# a head's products: they are below OpenBLAS's threshold.
SPLIT_MACS = 1 << 23
# A forward run for a backward keeps its probabilities (`_Kept`) where they take at most
# this many times the elements of q, k, v and the output together: the GPT bench's
# causal heads (T 128, E 32) keep 0.75 times as much, and their attention's forward and
# backward took 5.3 ms against 6.6 (bench/RESULTS.md, issue 13); a head of E 64 keeps
# them up to T = 1024 or so. Longer contexts grow them as T squared against T: they
# recompute them, as inference always does, and keep nothing of size (T, T).
KEEP_RATIO = 2


def row_blocks(batch: tuple[int, ...], length: int, keys: int, parts: int = 1
               ) -> list[tuple[int, int]]:
    """The (start, stop) query rows of each block: about BLOCK_ELEMENTS scores apiece
    in each of `parts` parts of the batch."""
    rows = BLOCK_ELEMENTS * parts // max(1, math.prod(batch) * keys)
    rows = max(1, min(length, rows))
    return [(i, min(i + rows, length)) for i in range(0, length, rows)]


def empty_attention(q: Array, k: Array) -> bool:
    """No queries or no keys: the output is zeros, as PyTorch gives, and so are the
    gradients."""
    return q.shape[-2] == 0 or k.shape[-2] == 0


class AttentionOps(Mixin):
    """softmax(q k^T * scale + bias) (* keep) v over (..., L, E), (..., S, E) and
    (..., S, Ev) operands whose batch dimensions broadcast, and its gradients."""

    if TYPE_CHECKING:  # BackwardOps' kernel, which the backward runs on backends with one
        def softmax_backward(self, upstream: Array, forward_output: Array, axis: int
                             ) -> Array: ...

    def attention(self, q: Array, k: Array, v: Array, bias: Array | None,
                  keep: Array | None, scale: float, causal: bool, *,
                  for_backward: bool = False) -> Array:
        """The attention output (..., L, Ev). `for_backward`: a backward will follow, and
        the result may carry the probabilities it would otherwise compute again (here
        it does not: these defaults recompute them)."""
        if empty_attention(q, k):
            batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
            return self.zeros(batch + (q.shape[-2], v.shape[-1]), q.dtype)
        blocks = _Blocks(self, q, k, bias, causal)
        scaled_q = self.mul(q, scale)  # (L, E) once, not each (L, S) block of scores
        outputs = []
        for start, stop in blocks.ranges:
            seen = blocks.seen(stop)
            p = blocks.probabilities(scaled_q, k, bias, start, stop)
            if keep is not None:
                p = self.mul(p, blocks.rows(keep, start, stop, seen))
            outputs.append(self.matmul(p, blocks.keys_of(v, seen)))
        return outputs[0] if len(outputs) == 1 else self.concatenate(outputs, -2)

    def attention_backward(self, upstream: Array, q: Array, k: Array, v: Array,
                           bias: Array | None, keep: Array | None, scale: float,
                           causal: bool, bias_grad: bool, out: Array | None = None
                           ) -> tuple[Array, Array, Array, Array | None]:
        """(dq, dk, dv, dbias or None): the scores' gradient is softmax's backward of dp,
        p * (dp - rowsum(p * dp)), dp being upstream v^T (times the dropout mask). `out`:
        the forward's result, where a forward run `for_backward` may have kept the
        probabilities (None, or a result without them: they are computed again)."""
        # The bias whose gradient is asked for: bias_grad is asked only with a bias.
        graded = bias if bias_grad else None
        assert graded is not None or not bias_grad, "attention_backward: bias_grad, no bias"
        if empty_attention(q, k):
            return (self.zeros(q.shape, q.dtype), self.zeros(k.shape, k.dtype),
                    self.zeros(v.shape, v.dtype),
                    self.zeros(graded.shape, graded.dtype) if graded is not None else None)
        blocks = _Blocks(self, q, k, bias, causal)
        scaled_q = self.mul(q, scale)
        dq_parts, dbias_parts, dk_parts, dv_parts = [], [], [], []
        for start, stop in blocks.ranges:
            seen = blocks.seen(stop)
            p = blocks.probabilities(scaled_q, k, bias, start, stop)
            g = blocks.rows(upstream, start, stop)
            k_seen, v_seen = blocks.keys_of(k, seen), blocks.keys_of(v, seen)
            kept = p if keep is None else self.mul(p, blocks.rows(keep, start, stop, seen))
            dv_parts.append(self.matmul(_swap(self, kept), g))
            dp = self.matmul(g, _swap(self, v_seen))
            if keep is not None:
                dp = self.mul(dp, blocks.rows(keep, start, stop, seen))
            ds = self.softmax_backward(dp, p, -1)  # BackwardOps': a vjp runs on such backends
            if graded is not None:
                dbias_parts.append(self.sum_to_shape(ds, _block_shape(graded, ds.ndim, start,
                                                                      stop)))
            dq_parts.append(self.matmul(ds, k_seen))
            dk_parts.append(self.matmul(_swap(self, ds), blocks.rows(scaled_q, start, stop)))
        dk, dv = _sum_keys(self, dk_parts, blocks.keys), _sum_keys(self, dv_parts, blocks.keys)
        dq = self.mul(dq_parts[0] if len(dq_parts) == 1 else self.concatenate(dq_parts, -2),
                      scale)
        dbias = None
        if graded is not None:
            along_rows = graded.shape[-2] != 1 and len(dbias_parts) > 1
            dbias = self.concatenate(dbias_parts, -2) if along_rows else _total(self,
                                                                               dbias_parts)
            dbias = self.reshape(dbias, graded.shape)
        return (self.sum_to_shape(dq, q.shape), self.sum_to_shape(dk, k.shape),
                self.sum_to_shape(dv, v.shape), dbias)


class _Blocks:
    """How one call walks its queries: row blocks, the keys each block sees, and the
    slices of the operands (masks broadcast along an axis are not sliced there)."""

    def __init__(self, backend: Any, q: Any, k: Any, bias: Any, causal: bool):
        self.backend, self.causal = backend, causal
        self.length, self.keys = q.shape[-2], k.shape[-2]
        self.ranges = row_blocks(np.broadcast_shapes(q.shape[:-2], k.shape[:-2]),
                                 self.length, self.keys)
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


# ---------------------------------------------------------------- the NumPy form


class CpuAttentionOps(AttentionOps):
    """The unmasked case over NumPy arrays of one float dtype and one batch shape, with
    views, products into views and the causal mask inside the softmax kernel; masks,
    dropout and broadcast batch dimensions take AttentionOps' path. Results are laid
    out as their operand is (`np.empty_like`): q, k and v are usually heads cut from
    (N, T, H, D) by a transpose, and the transpose back then costs no copy. Measured
    against AttentionOps' path on the GPT bench's causal heads (one thread, forward +
    backward, taking turns in one process): a bit over half its time, the difference
    being the key blocks AttentionOps copies (`getitem`), its mask pass (`where`) and
    its concatenations (bench/RESULTS.md, issue 13)."""

    def attention(self, q: Array, k: Array, v: Array, bias: Array | None,
                  keep: Array | None, scale: float, causal: bool, *,
                  for_backward: bool = False) -> Array:
        if not _unmasked(q, k, v, bias, keep):
            return super().attention(q, k, v, bias, keep, scale, causal)
        # The scale rounded to q's dtype: the kernels' products then round as q's dtype's.
        scale = float(q.dtype.type(scale))
        blocks = _call_blocks(q.shape[:-2], q.shape[-2], k.shape[-2])
        shape = q.shape[:-1] + (v.shape[-1],)
        operands = q.size + k.size + v.size + math.prod(shape)
        if for_backward and _Kept.elements(q.shape[:-2], k.shape[-2], causal, blocks,
                                           operands):
            out, kept = _Kept.allocate(q, shape, k.shape[-2], causal, blocks)
        else:
            out, kept = np.empty_like(q, shape=shape), []

        def heads(part: Callable) -> None:
            qp, kp, vp, outp, *keptp = part((q, k, v, out, *kept))
            _forward(qp, kp, vp, scale, causal, blocks, outp, keptp)

        _by_heads(q, k, v, heads)
        return out

    def attention_backward(self, upstream: Array, q: Array, k: Array, v: Array,
                           bias: Array | None, keep: Array | None, scale: float,
                           causal: bool, bias_grad: bool, out: Array | None = None
                           ) -> tuple[Array, Array, Array, Array | None]:
        if not _unmasked(q, k, v, bias, keep) or upstream.shape != q.shape[:-1] + v.shape[-1:]:
            return super().attention_backward(upstream, q, k, v, bias, keep, scale, causal,
                                              bias_grad)
        dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
        scale = float(q.dtype.type(scale))
        found = None if out is None else _Kept.find(out, q.shape[:-2], k.shape[-2], causal)
        if found is None:
            blocks = _call_blocks(q.shape[:-2], q.shape[-2], k.shape[-2])
            kept: list[np.ndarray] = []
        else:
            blocks, kept = found  # the forward's blocks, whatever the threads are now

        def heads(part: Callable) -> None:
            up, qp, kp, vp, dqp, dkp, dvp, *keptp = part((upstream, q, k, v, dq, dk, dv,
                                                          *kept))
            _backward(up, qp, kp, vp, scale, causal, blocks, dqp, dkp, dvp, keptp)

        _by_heads(q, k, v, heads)
        return dq, dk, dv, None


class _Kept:
    """Where a forward run for a backward keeps its probabilities (where `elements`
    says): in one allocation with its result, after it, so that they live exactly as
    long as the result the backward is handed (the node's saved output, a training
    plan's saved value) and no longer. The allocation holds the result (laid out as q
    is, as the forward's results always are), then each query block's probabilities
    (the batch dimensions, the block's rows, the keys it sees: a causal block's only),
    then the block's row count, from which the backward finds the blocks again whatever
    the threads are by then. A result that is not such a view (a copy, another
    forward's) finds nothing, and its backward computes the probabilities again, as
    the same kernels do."""

    @staticmethod
    def sizes(batch: tuple[int, ...], keys: int, causal: bool,
              blocks: list[tuple[int, int]]) -> list[tuple[int, ...]]:
        """The shape each block's probabilities are kept in."""
        return [batch + (stop - start, min(keys, stop) if causal else keys)
                for start, stop in blocks]

    @staticmethod
    def elements(batch: tuple[int, ...], keys: int, causal: bool,
                 blocks: list[tuple[int, int]], operands: int) -> int:
        """How many probabilities a forward over `blocks` keeps: all of them where they
        take at most KEEP_RATIO times the elements of q, k, v and the result together
        (`operands`), else none."""
        kept = sum(math.prod(s) for s in _Kept.sizes(batch, keys, causal, blocks))
        return kept if kept <= KEEP_RATIO * operands else 0

    @staticmethod
    def allocate(q: np.ndarray, shape: tuple[int, ...], keys: int, causal: bool,
                 blocks: list[tuple[int, int]]) -> tuple[np.ndarray, list[np.ndarray]]:
        """The result (shape, laid out as q) and each block's probabilities, empty."""
        shapes = _Kept.sizes(q.shape[:-2], keys, causal, blocks)
        n = math.prod(shape)
        whole = np.empty(n + sum(math.prod(s) for s in shapes) + 1, q.dtype)
        whole[-1] = blocks[0][1] - blocks[0][0]
        # q's axes outermost first (by stride; ties keep their order), as empty_like lays
        # out its result.
        order = sorted(range(q.ndim), key=lambda axis: -q.strides[axis])
        out = whole[:n].reshape([shape[a] for a in order]).transpose(np.argsort(order))
        return out, _Kept.views(whole, n, shapes)

    @staticmethod
    def views(whole: np.ndarray, at: int, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
        """The blocks' probabilities: views of `whole`, one after the other from `at`."""
        kept = []
        for s in shapes:
            kept.append(whole[at:at + math.prod(s)].reshape(s))
            at += math.prod(s)
        return kept

    @staticmethod
    def find(out: np.ndarray, batch: tuple[int, ...], keys: int, causal: bool
             ) -> tuple[list[tuple[int, int]], list[np.ndarray]] | None:
        """(the blocks, their probabilities) kept beside `out`, or None."""
        whole = out.base
        if (type(whole) is not np.ndarray or whole.ndim != 1 or whole.dtype != out.dtype
                or whole.size <= out.size or not out.size
                or out.__array_interface__["data"][0] != whole.__array_interface__["data"][0]):
            return None
        rows, length = whole[-1], out.shape[-2]
        if not (1 <= rows <= length and rows == int(rows)):  # NaN fails the first test
            return None
        rows = int(rows)
        blocks = [(i, min(i + rows, length)) for i in range(0, length, rows)]
        shapes = _Kept.sizes(batch, keys, causal, blocks)
        if whole.size != out.size + sum(math.prod(s) for s in shapes) + 1:
            return None
        return blocks, _Kept.views(whole, out.size, shapes)


def _split_axis(batch: tuple[int, ...]) -> int | None:
    """The batch axis `_by_heads` cuts: the first of more than one."""
    return next((i for i, size in enumerate(batch) if size > 1), None)


def _head_parts(batch: tuple[int, ...]) -> int:
    """How many parts `_by_heads` cuts heads of these batch dimensions into on BLAS's
    threads, whether or not a call is large enough to split: its query blocks count
    BLOCK_ELEMENTS per part, the same blocks split or not."""
    axis = _split_axis(batch)
    return 1 if axis is None else len(split.parts(batch[axis]))


def _call_blocks(batch: tuple[int, ...], length: int, keys: int) -> list[tuple[int, int]]:
    """The query blocks of a CpuAttentionOps call now: BLOCK_ELEMENTS scores per part of
    the heads (`_head_parts`)."""
    return row_blocks(batch, length, keys, _head_parts(batch))


def kept_elements(batch: tuple[int, ...], length: int, keys: int, width: int,
                  value_width: int, causal: bool) -> int:
    """How many probabilities `CpuAttentionOps`' forward run for a backward keeps beside
    its result for unmasked operands of these sizes, called now (its blocks follow
    BLAS's threads): for a plan's memory estimates."""
    blocks = _call_blocks(batch, length, keys)
    operands = math.prod(batch) * (length * width + keys * (width + value_width)
                                   + length * value_width)
    return _Kept.elements(batch, keys, causal, blocks, operands)


def _by_heads(q: np.ndarray, k: np.ndarray, v: np.ndarray, run: Callable) -> None:
    """run(part) once per part of the batch dimensions, at once on BLAS's threads
    (pullback.backend.split) from SPLIT_MACS multiply-adds: `part` cuts a tuple of
    operands and results to the part's heads, along the first batch axis of more than
    one. The query blocks are the whole call's (`_head_parts`) and each head is computed
    alone (NumPy's stacked products are one BLAS call per head), so the parts give one
    call's results bit for bit, whichever thread runs them."""
    batch = q.shape[:-2]
    axis = _split_axis(batch)
    macs = math.prod(batch) * q.shape[-2] * k.shape[-2] * (q.shape[-1] + v.shape[-1])
    if axis is None or macs < SPLIT_MACS:
        run(lambda arrays: arrays)
        return

    def cut(i: int, j: int) -> None:
        index = (slice(None),) * axis + (slice(i, j),)
        run(lambda arrays: tuple(a[index] for a in arrays))

    split.over_parts(batch[axis], cut)


def _forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, causal: bool,
             blocks: list[tuple[int, int]], out: np.ndarray, kept: list[np.ndarray]) -> None:
    """CpuAttentionOps' forward into `out`, over the query blocks `blocks`; each block's
    probabilities into `kept`'s array for it, if `kept` has them (`_Kept`)."""
    for b, (start, stop) in enumerate(blocks):
        seen = min(k.shape[-2], stop) if causal else k.shape[-2]
        p = _probabilities(q, k, start, stop, seen, causal, scale, kept[b] if kept else None)
        np.matmul(p, v[..., :seen, :], out=out[..., start:stop, :])


def _backward(upstream: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
              scale: float, causal: bool, blocks: list[tuple[int, int]], dq: np.ndarray,
              dk: np.ndarray, dv: np.ndarray, kept: list[np.ndarray]) -> None:
    """CpuAttentionOps' backward into dq, dk and dv, over the query blocks `blocks`, with
    each block's probabilities from `kept` where the forward kept them (computed again
    otherwise). The scale rides in the softmax kernels (forward and backward), so the
    scores' gradient ds already holds it: dq = ds k and dk = ds^T q, with no pass over q
    or dq for it."""
    keys = k.shape[-2]
    # The last block sees the most keys (all of them unless causal with fewer queries
    # than keys): it writes dk and dv, the others add into their first rows.
    first = True
    for b in reversed(range(len(blocks))):
        start, stop = blocks[b]
        seen = min(keys, stop) if causal else keys
        p = kept[b] if kept else _probabilities(q, k, start, stop, seen, causal, scale)
        g = upstream[..., start:stop, :]
        k_seen, v_seen = k[..., :seen, :], v[..., :seen, :]
        dp = np.matmul(g, np.swapaxes(v_seen, -1, -2))
        ds = compiled_rows.scaled_softmax_backward(dp, p, scale)
        np.matmul(ds, k_seen, out=dq[..., start:stop, :])
        if first:
            np.matmul(np.swapaxes(p, -1, -2), g, out=dv[..., :seen, :])
            np.matmul(np.swapaxes(ds, -1, -2), q[..., start:stop, :], out=dk[..., :seen, :])
            dk[..., seen:, :] = 0  # keys no query sees
            dv[..., seen:, :] = 0
            first = False
        else:
            dv[..., :seen, :] += np.matmul(np.swapaxes(p, -1, -2), g)
            dk[..., :seen, :] += np.matmul(np.swapaxes(ds, -1, -2), q[..., start:stop, :])


def _unmasked(q: Any, k: Any, v: Any, bias: Any, keep: Any) -> bool:
    """Whether CpuAttentionOps' NumPy form takes the call."""
    return (bias is None and keep is None and type(q) is np.ndarray
            and type(k) is np.ndarray and type(v) is np.ndarray
            and q.dtype in SUPPORTED_DTYPES and q.dtype == k.dtype == v.dtype
            and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
            and not empty_attention(q, k))


def _probabilities(q: np.ndarray, k: np.ndarray, start: int, stop: int, seen: int,
                   causal: bool, scale: float, out: np.ndarray | None = None) -> np.ndarray:
    """softmax(q k^T * scale) for the queries start:stop over their first `seen` keys
    (into `out` if given); causal: query i's weights past key i are zero. The scale and
    the mask are applied in the softmax's own pass, not in passes over q or the scores."""
    scores = np.matmul(q[..., start:stop, :], np.swapaxes(k[..., :seen, :], -1, -2))
    visible = np.minimum(np.arange(start + 1, stop + 1), seen) if causal else seen
    counts = np.ascontiguousarray(np.broadcast_to(visible, scores.shape[:-1]), dtype=np.intp)
    return compiled_rows.causal_softmax(scores, counts, scale, out=out)


def attention_ops(backend: Backend) -> AttentionOps:
    """The backend's attention ops: its own, or the defaults written in its forward ops."""
    return backend if isinstance(backend, AttentionOps) else _Defaults(backend)


class _Defaults(AttentionOps):
    """AttentionOps' defaults over the forward ops of a backend without AttentionOps."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)
