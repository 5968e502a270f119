"""Matrix products on pullback's own threads, in register tiles: c[i] = a[i] @ b[i] for a
stack of matrices, each operand read where it lies (no packing), the work cut over the
threads of Numba's parallel loops.

A convolution over a batch of one cannot split by sample, and left to BLAS its products
run on BLAS's threads, whose workers then spin between products on the cores that the
passes around them (im2col, Winograd's transforms) and the next product's threads need;
on a ResNet-50 inference BLAS's products ran at 120-135 GFLOP/s in sequence where they
reach 150-200 alone (bench/RESULTS.md). Here every product of such a convolution runs on
the same crew of threads, and BLAS's stay asleep.

Each product is cut into parts of a[i]'s rows, one part a thread (a stack of more
matrices than threads: one matrix a thread at a time). A part walks c in column blocks
(NC columns: the block of b stays in L2), k in blocks of KC (a tile's rows of a stay
in L1), and its rows ROWS at a time, each tile ROWS x VECTORS SIMD vectors of results
held in registers while k runs (pullback.kernels.tiles' intrinsic, b read through its
row stride). Columns past the last whole vector are computed from a zero-padded copy
of b's last columns into a scratch, then copied. Each result is its row of a times its
column of b summed in k order, KC at a time: the same bits whichever thread runs it.

One file on purpose: Numba's disk cache notices an edit to a kernel's own file only
(and tiles.py's, through `jit.depending_on`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from pullback.errors import KernelError
from pullback.kernels import direct, jit, tiles
from pullback.kernels.conv import check_dtype

ROWS = 8  # rows of a (and c) per tile: with VECTORS, 24 accumulators of 32 registers
VECTORS = 3  # SIMD vectors of columns per tile
KC = 256  # k per pass over a tile: a tile's rows of a, 8 KiB (float32), stay in L1
NC = 384  # columns per block: with KC rows of b, 384 KiB (float32), in L2
SHAPES = [(rows, vectors) for rows in range(1, ROWS + 1) for vectors in range(1, VECTORS + 1)]


# ---------------------------------------------------------------- kernel bodies
# `tile` and `tile_add` are pullback.kernels.direct's oracles in plain Python, LLVM IR
# compiled (tiles.tile_switch_intrinsic); LANES is the dtype's vector width (rebound per
# dtype where compiled, as prange is to numba.prange).
tile, tile_add, LANES, prange = direct.tile, direct.tile_add, direct.LANES, range


def part_body(a, b, c, first, stop, tail_b, tail_c):
    """c[first:stop] = a[first:stop] @ b: a (M, K), b (K, P), c (M, P), unit-strided
    rows; tail_b (K, LANES) holds b's columns past its last whole vector (zeros after
    them), tail_c (M, LANES) is scratch for their results."""
    k_ = a.shape[1]
    p_ = b.shape[1]
    whole = p_ // LANES * LANES
    for j0 in range(0, p_, NC):
        j1 = min(whole, j0 + NC)
        tail = j0 + NC >= p_ and whole < p_
        for k0 in range(0, k_, KC):
            kc = min(KC, k_ - k0)
            for i in range(first, stop, ROWS):
                rows = min(ROWS, stop - i)
                for j in range(j0, j1, VECTORS * LANES):
                    vectors = min(VECTORS, (j1 - j) // LANES)
                    if k0 == 0:
                        tile(rows, vectors, a, i, k0, b, j, k0, c, i, j, kc)
                    else:
                        tile_add(rows, vectors, a, i, k0, b, j, k0, c, i, j, kc)
                if tail:
                    if k0 == 0:
                        tile(rows, 1, a, i, k0, tail_b, 0, k0, tail_c, i, 0, kc)
                    else:
                        tile_add(rows, 1, a, i, k0, tail_b, 0, k0, tail_c, i, 0, kc)
        if tail:
            for i in range(first, stop):
                for j in range(whole, p_):
                    c[i, j] = tail_c[i, j - whole]


def stack_body(a, b, c, tail_b, tail_c, parts):
    """c[i] = a[i] @ b[i] for every matrix i of the stacks, each cut into `parts` parts
    of its rows (multiples of ROWS), every (matrix, part) one iteration of a parallel
    loop. tail_b (n, K, LANES), tail_c (n, M, LANES): each matrix's `part_body` tails."""
    n_, m_, k_ = a.shape
    p_ = b.shape[2]
    whole = p_ // LANES * LANES
    if whole < p_:
        for i in range(n_):
            for k in range(k_):
                for j in range(whole, p_):
                    tail_b[i, k, j - whole] = b[i, k, j]
    per = ((m_ + parts - 1) // parts + ROWS - 1) // ROWS * ROWS
    for t in prange(n_ * parts):
        i = t // parts
        first = t % parts * per
        if first < m_:
            part_body(a[i], b[i], c[i], first, min(m_, first + per), tail_b[i], tail_c[i])



# ---------------------------------------------------------------- compilation


def compiled(dtype: np.dtype, parallel: bool = True) -> Any:
    """stack_body compiled for `dtype`, as a parallel loop or a plain one, its tiles
    LLVM IR; cached on disk, once a process."""
    return jit.compiled_once((stack_body, dtype, parallel), _make, dtype, parallel,
                             parallel=parallel)


def _make(dtype: np.dtype, parallel: bool) -> tuple[Any, tuple]:
    nb = jit.numba()
    scope: dict[str, Any] = dict(stack_body.__globals__)
    scope["LANES"] = tiles.lanes(dtype)
    scope["prange"] = nb.prange if parallel else range
    scope["tile"] = tiles.tile_switch_intrinsic(SHAPES)
    scope["tile_add"] = tiles.tile_switch_intrinsic(SHAPES, accumulate=True)
    scope["part_body"] = nb.njit(inline="always", **jit.JIT_OPTIONS)(
        jit.rebound(part_body, scope))
    stack = jit.array_type(dtype, 3, "A")
    signature = (jit.array_type(dtype, 3, "A", readonly=True),
                 jit.array_type(dtype, 3, "A", readonly=True), stack,
                 jit.array_type(dtype, 3, "C"), jit.array_type(dtype, 3, "C"), nb.int64)
    body = jit.rebound(stack_body, scope)
    body.__qualname__ = f"stack_body_{'parallel' if parallel else 'serial'}"
    return jit.depending_on(body, tiles), signature


# ---------------------------------------------------------------- entry point


_started = False  # this process has started Numba's threads (a parallel loop ran)
_inherited = False  # this process was forked from one that had started them


def _forked() -> None:
    global _inherited, _started
    _inherited, _started = _inherited or _started, False


os.register_at_fork(after_in_child=_forked)


def threads() -> int:
    """The threads a product may run on: Numba's parallel loops' count; 1 in a process
    forked from one whose loops had started their threads, which GNU OpenMP's (Numba's
    usual threading layer) do not survive: the child's first parallel loop would hang."""
    return 1 if _inherited else int(jit.numba().get_num_threads())


def starting() -> None:
    """Note that this process runs parallel loops from now on (this module's, or a
    caller's around them: their threads are the same)."""
    global _started
    _started = True


def matmul(a: np.ndarray, b: np.ndarray, c: np.ndarray, threads: int) -> np.ndarray:
    """c[i] = a[i] @ b[i]: a (n, M, K), b (n, K, P), c (n, M, P), one float dtype, each
    with unit-strided rows (any other strides), c overlapping neither operand; its work
    over `threads` threads at most. Returns c."""
    dtype = check_dtype("matmul", [a, b, c])
    n, m, k = a.shape if a.ndim == 3 else (0, 0, 0)
    if (a.ndim != 3 or b.shape != (n, k, b.shape[-1]) or c.shape != (n, m, b.shape[-1])):
        raise KernelError("matmul", [a, b, c], "expected stacks a (n, M, K), b (n, K, P) "
                                               "and c (n, M, P)")
    if any(x.strides[2] != x.itemsize for x in (a, b, c) if x.size):
        raise KernelError("matmul", [a, b, c], "every operand's rows must be unit-strided")
    if np.may_share_memory(c, a) or np.may_share_memory(c, b):
        raise KernelError("matmul", [a, b, c], "the result must not overlap an operand")
    if c.size == 0:
        return c
    if k == 0:
        c[...] = 0
        return c
    lanes = tiles.lanes(dtype)
    tail_b = np.zeros((n, k, lanes), dtype)
    tail_c = np.empty((n, m, lanes), dtype)
    # One matrix a thread where the stack has enough of them to keep every thread busy;
    # else each matrix's rows cut over the threads.
    parts = 1 if n >= 2 * threads else max(1, min(threads, -(-m // ROWS)))
    if threads > 1 and not _inherited:
        starting()
        compiled(dtype)(a, b, c, tail_b, tail_c, parts)
    else:
        compiled(dtype, parallel=False)(a, b, c, tail_b, tail_c, 1)
    return c
