"""How the NumPy backends lay out a matrix product's result, and bias sums as GEMVs.

OpenBLAS (NumPy's, on these machines) computes a product whose result has fewer
rows than columns faster when it writes the result by columns, that is, when it
solves the transposed problem: a dense layer's forward on a batch of 256 and 1024
features, or its input gradient, 15-25% faster; a product with a small inner
dimension (a 10-class layer's input gradient) 3x faster (measurements in
bench/RESULTS.md). Such results are therefore Fortran-ordered. The order depends
on the result's shape alone, so the arrays of one shape in a step (a layer's
output, its activation, their gradients) share it, and elementwise kernels run
on them without copies (see kernels.elementwise).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from pullback.backend import blas, split

# Below this many result elements the order makes no measurable difference; small
# results stay C-ordered.
MIN_ELEMENTS = 4096


# Work on a block of a product's result right after it is computed, given the block and
# which of the result's rows and columns it holds: pullback.backend.cpu's bias and relu
# in place after a dense layer's product, and the bias gradient's column sums beside a
# dense layer's weight gradient.
BlockEpilogue = Callable[[np.ndarray, slice, slice], None]
_ALL = slice(None)


# Column sums as a GEMV accumulate each column in BLAS's blocked order rather than
# NumPy's pairwise one; up to this many rows the two agree to a few ulps of the sum.
COLUMN_SUM_ROWS = 8192

_ONES: dict[tuple[int, np.dtype], np.ndarray] = {}


def ones(n: int, dtype: np.dtype) -> np.ndarray:
    """A read-only vector of n ones, made once per length and dtype: column sums as
    GEMVs multiply by it."""
    vector = _ONES.get((n, dtype))
    if vector is None:
        vector = _ONES[(n, dtype)] = np.ones(n, dtype)
        vector.setflags(write=False)
    return vector


def bias_sums(x: np.ndarray, shape: tuple) -> np.ndarray | None:
    """x summed to `shape` where that keeps one block of x's axes (a bias broadcast over
    the rest: (C,) over (N, C), (C, 1, 1) over (N, C, H, W)), as GEMVs with a vector of
    ones: the trailing axes first, then the leading ones. None when `shape` is not such
    a block, x is not contiguous, or there are too many rows for BLAS's summation
    order to stay within a few ulps of NumPy's."""
    dims = x.shape
    if x.size == 0:
        return None  # an empty batch: NumPy's reduction gives the zeros
    if x.ndim == 2 and shape == (dims[1],):  # the commonest: a dense layer's bias
        first, last = 1, 2
    else:
        padded = (1,) * (x.ndim - len(shape)) + shape
        kept = [i for i, d in enumerate(padded) if d != 1 or dims[i] == 1]
        if not kept or kept[-1] - kept[0] + 1 != len(kept):
            return None
        first, last = kept[0], kept[-1] + 1
    outer, inner = math.prod(dims[:first]), math.prod(dims[last:])
    middle = math.prod(dims[first:last])
    if outer * inner == 1 or max(outer, inner) > COLUMN_SUM_ROWS:
        return None
    by_columns = x.ndim == 2 and inner == 1 and x.flags.f_contiguous  # a dense layer's
    if not by_columns and not x.flags.c_contiguous:
        return None
    # On one BLAS thread while products split (`product`): a GEMV BLAS threads leaves
    # its workers spinning on the cores the split products next to it need; GPT's step
    # took 190-200 ms against 118-122 with its bias gradients so. Once BLAS threads
    # other paths' products anyway, its threads sum faster.
    with contextlib.nullcontext() if blas.products_threaded() else blas.one_thread():
        if by_columns:
            sums = np.matmul(ones(outer, x.dtype), x)
        else:
            sums = x.reshape(outer * middle, inner)
            if inner > 1:
                sums = np.matmul(sums, ones(inner, x.dtype))
            if outer > 1:
                sums = np.matmul(ones(outer, x.dtype), sums.reshape(outer, middle))
    return sums.reshape(shape)


def result_order(rows: int, cols: int) -> Literal["C", "F"]:
    """"F" (by columns) for a matrix product's (rows, cols) result that BLAS computes
    faster that way, "C" otherwise."""
    return "F" if rows < cols and rows * cols >= MIN_ELEMENTS else "C"


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
           epilogue: BlockEpilogue | None = None) -> np.ndarray:
    """np.matmul(a, b) (into `out` when given), a 2-D floating result laid out as
    `result_order` says, a stack of matrices times one matrix as one 2-D product, a
    large 2-D product split over BLAS's threads (`product`); `epilogue` then runs in
    place on the result (a stack's as its 2-D matrix), each split part's block on its
    own thread while it is in cache."""
    if a.ndim > 2 and b.ndim == 2 and a.shape[-1] == b.shape[0] and a.dtype == b.dtype:
        return _stacked(a, b, out, epilogue)
    if out is not None:
        return product(a, b, out, epilogue)
    if (a.ndim == 2 and b.ndim == 2 and a.dtype == b.dtype and a.dtype.kind == "f"
            and a.shape[1] == b.shape[0]):
        order = result_order(a.shape[0], b.shape[1])
        return product(a, b, np.empty((a.shape[0], b.shape[1]), a.dtype, order=order),
                       epilogue)
    result = _whole(a, b, ...)
    if epilogue is not None:
        epilogue(result.reshape(-1, result.shape[-1]) if result.ndim > 2 else result, _ALL,
                 _ALL)
    return result


# A product of at least this many multiply-adds runs as one part per BLAS thread on
# pullback's threads (pullback.backend.split), BLAS on one thread in each part: a
# transformer's (2048, 128) @ (128, 384) and its gradients. BLAS's own threads left
# spinning after such a product took a core from the passes pullback splits between
# them (attention's heads): GPT's training step took 131-138 ms with BLAS threading its
# products and 119-123 with them split here (bench/RESULTS.md, issue 13). The digits
# MLP's 128 x 256 x 256 (2**23) took its step a third longer split: too short a part.
SPLIT_MACS = 1 << 24


def blasable(x: np.ndarray) -> np.ndarray:
    """x, or a contiguous copy of a matrix broadcast along an axis (a zero stride):
    NumPy's matmul hands BLAS no such operand and multiplies it in a loop of its own
    instead. ONNX's ResNet-50 `light` model's 2048 x 1000 classifier weight is one
    value broadcast: 1.9 ms a product that way, 0.45 copied first."""
    if x.ndim == 2 and x.size > 1 and 0 in x.strides:
        return np.ascontiguousarray(x)
    return x


def product(a: np.ndarray, b: np.ndarray, out: np.ndarray,
            epilogue: BlockEpilogue | None = None) -> np.ndarray:
    """np.matmul(a, b, out=out); a 2-D float product of at least SPLIT_MACS
    multiply-adds is cut into one part per BLAS thread along the result's rows (a
    C-ordered `out`) or columns (a Fortran-ordered one), each part one BLAS call into
    its block of `out`, then `epilogue` on that block; unless another path has had BLAS
    thread its products in this process (`blas.products_threaded`: their workers spin
    on the cores the parts need), when BLAS threads it itself, or where `out` overlaps
    an operand; a product not split runs on one BLAS thread where pullback splits
    others (`_whole`). The parts round apart from one call (BLAS's kernels for a
    block's edges, and its own threads, round apart too), within float error. A
    broadcast operand is copied first (`blasable`)."""
    a, b = blasable(a), blasable(b)
    if (a.ndim != 2 or b.ndim != 2 or out.ndim != 2 or a.dtype.kind != "f"
            or not a.dtype == b.dtype == out.dtype or a.shape[1] != b.shape[0]
            or out.shape != (a.shape[0], b.shape[1])
            or a.shape[0] * a.shape[1] * b.shape[1] < SPLIT_MACS or blas.products_threaded()
            # A part would write what another still reads: NumPy copies an operand the
            # result overlaps, within one call only.
            or np.may_share_memory(out, a) or np.may_share_memory(out, b)):
        _whole(a, b, out)
        if epilogue is not None:
            epilogue(out, _ALL, _ALL)
        return out
    if out.flags.f_contiguous and not out.flags.c_contiguous:
        def columns(i: int, j: int) -> None:
            np.matmul(a, b[:, i:j], out=out[:, i:j])
            if epilogue is not None:
                epilogue(out[:, i:j], _ALL, slice(i, j))

        split.over_parts(b.shape[1], columns)
        return out

    def rows(i: int, j: int) -> None:
        np.matmul(a[i:j], b, out=out[i:j])
        if epilogue is not None:
            epilogue(out[i:j], slice(i, j), _ALL)

    split.over_parts(a.shape[0], rows)
    return out


def _whole(a: np.ndarray, b: np.ndarray, out: Any) -> np.ndarray:
    """np.matmul(a, b, out=out) as one call, on one BLAS thread where
    `blas.quiet_products` (a BLAS worker woken here would spin on a core that work
    pullback splits next needs)."""
    if blas.quiet_products():
        with blas.one_thread():
            return np.matmul(a, b, out=out)
    return np.matmul(a, b, out=out)


def c_product(a: np.ndarray, b: np.ndarray, epilogue: BlockEpilogue | None = None) -> np.ndarray:
    """a @ b (2-D) into a new C-ordered array, whatever its shape (`product`)."""
    return product(a, b, np.empty((a.shape[0], b.shape[1]), np.result_type(a, b)), epilogue)


def _stacked(a: np.ndarray, b: np.ndarray, out: np.ndarray | None,
             epilogue: BlockEpilogue | None = None) -> np.ndarray:
    """(..., M, K) @ (K, N) as one (rows, K) @ (K, N) product. NumPy runs the stacked
    form as one BLAS call per matrix of the stack; on two OpenBLAS threads a
    transformer's (16, 128, 128) @ (128, 384) took 6-12x longer that way than as one
    product on a busy machine (alike on one thread): bench/RESULTS.md, issue 13."""
    rows = math.prod(a.shape[:-1])
    shape = a.shape[:-1] + (b.shape[1],)
    flat = a.reshape(rows, a.shape[-1])  # a copy only where a's rows are not contiguous
    if out is None:
        return c_product(flat, b, epilogue).reshape(shape)
    if out.flags.c_contiguous:
        product(flat, b, out.reshape(rows, b.shape[1]), epilogue)  # a view: into out
        return out
    out[...] = c_product(flat, b, epilogue).reshape(shape)
    return out
