"""Matrix products on pullback's own threads, in register tiles: c[i] = a[i] @ b[i] for a
stack of matrices, each operand read where it lies (no packing), the work cut over the
threads of Numba's parallel loops.

A convolution over a batch of one cannot split by sample, and left to BLAS its products
run on BLAS's threads, whose workers then spin between products on the cores that the
passes around them (im2col, Winograd's transforms) and the next product's threads need;
on a ResNet-50 inference BLAS's products ran at 120-135 GFLOP/s in sequence where they
reach 150-200 alone (bench/RESULTS.md). Here every product of such a convolution runs on
the same crew of threads, and BLAS's stay asleep.

Each product is cut into parts of a[i]'s rows or of b[i]'s columns, one part a thread
(a stack of more matrices than threads: one matrix a thread at a time). A part walks c
in column blocks (NC columns: the block of b stays in L2), k in blocks of KC (a tile's
rows of a stay in L1), and its rows ROWS at a time, each tile ROWS x VECTORS SIMD
vectors of results held in registers while k runs (pullback.kernels.tiles' intrinsic,
b read through its row stride), vectors of 512 bits where the CPU has AVX-512 (`_lanes`;
ResNet-50's products took 0.80-0.95x the time of 256-bit ones, though Zen 4 splits each
into two halves: half the instructions and loads). Each result is its row of a times its
column of b summed in k order, KC at a time, except in the columns past the last whole
vector (49 = 3 x 16 + 1 on a 7x7 map, float32): a tile would spend a whole vector's
multiply-adds and a row's broadcasts on each, so these are dot products of a's rows with
a copy of the columns laid along k, summed a vector of k at a time (`tail_dot`;
ResNet-50's 7x7 products took 11-16% less time so, in 256-bit vectors). Either way, the
same bits whichever thread runs it.

A first layer's convolution (few channels, a large map: a stem's 3 x 7 x 7 windows on
112 x 112 outputs, 7.4 MB of them) need not write its windows whole: `windows_matmul`
cuts the output rows into blocks over the threads, each block's windows unfolded into a
scratch that stays in L2 (pullback.kernels.conv's unfold) and multiplied there.

One file on purpose: Numba's disk cache notices an edit to a kernel's own file only
(and, through `jit.depending_on`, to tiles.py's intrinsic, epilogue.py's `finished` and
conv.py's unfold, which compile into it).
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

import numpy as np

from pullback.errors import KernelError
from pullback.kernels import conv as conv_kernels
from pullback.kernels import direct, jit, tiles
from pullback.kernels import epilogue as epilogue_pass
from pullback.kernels.conv import check_dtype
from pullback.kernels.epilogue import finished

ROWS = 8  # rows of a (and c) per tile: with VECTORS, 24 accumulators of AVX-512's 32
VECTORS = 3  # SIMD vectors of columns per tile
KC = 256  # k per pass over a tile: a tile's rows of a, 8 KiB (float32), stay in L1
NC = 384  # columns per block: with KC rows of b, 384 KiB (float32), in L2
SHAPES = [(rows, vectors) for rows in range(1, ROWS + 1) for vectors in range(1, VECTORS + 1)]


# ---------------------------------------------------------------- kernel bodies
# `tile` and `tile_add` are pullback.kernels.direct's oracles in plain Python, LLVM IR
# compiled (tiles.tile_switch_intrinsic); LANES is the dtype's vector width (rebound per
# dtype where compiled, as prange is to numba.prange).
tile, tile_add, LANES, prange = direct.tile, direct.tile_add, direct.LANES, range
unfold = conv_kernels.unfold_body  # compiled: its kernel (conv_kernels.compiled)
U = np.uint64


def finish(c, first, stop, lo, hi, per_channel, residual, flags, zero, channel0):
    """A convolution's epilogue (pullback.kernels.epilogue.finished, so the same bits as
    its pass) on c[first:stop, lo:hi], row i channel channel0 + i: per_channel[0..2]
    its bias, scale and shift, residual[i, j] its residual, each where its flag
    (flags[0..3]) is set, then relu where flags[4] is."""
    has_bias, has_scale, has_shift = flags[0] != 0, flags[1] != 0, flags[2] != 0
    has_residual, relu = flags[3] != 0, flags[4] != 0
    for i in range(first, stop):
        ch = channel0 + i
        bias = per_channel[0, ch] if has_bias else zero
        scale = per_channel[1, ch] if has_scale else zero
        shift = per_channel[2, ch] if has_shift else zero
        row = c[i]
        values = residual[i] if has_residual else row
        # Unsigned indices: no negative-index wrapping, whose test stops LLVM vectorizing
        for t in range(U(hi - lo)):
            j = U(lo) + t
            added = values[j] if has_residual else zero
            row[j] = finished(row[j], bias, scale, shift, added, has_bias, has_scale,
                              has_shift, has_residual, relu, zero)


def tail_dot(a, first, stop, k0, kc, tail_b, width, c, column, accumulate, zero):
    """c[i, column + t] = (or +=, `accumulate`) a[i, k0:k0 + kc] . tail_b[t, k0:k0 + kc]
    for the rows first..stop and t < width. Compiled with reassociation allowed, so that
    the sums run a SIMD vector of k at a time."""
    for i in range(first, stop):
        row = a[i]
        for t in range(width):
            other = tail_b[t]
            total = zero
            for q in range(U(kc)):
                total += row[U(k0) + q] * other[U(k0) + q]
            if accumulate:
                c[i, column + t] += total
            else:
                c[i, column + t] = total


def lay_tail(b, tail_b):
    """tail_b[t, k] = b[k, whole + t]: b's (K, P) columns past its last whole vector,
    laid along k for `tail_dot`."""
    whole = b.shape[1] // LANES * LANES
    for k in range(b.shape[0]):
        for j in range(whole, b.shape[1]):
            tail_b[j - whole, k] = b[k, j]


def part_body(a, b, c, first, stop, lo, hi, tail_b, per_channel, residual, flags, zero,
              channel0, shift):
    """c[first:stop, shift + lo:shift + hi] = a[first:stop] @ b[:, lo:hi]: a (M, K), b
    (K, P), c (M, shift + P at least), unit-strided rows, lo a whole number of tiles'
    columns, hi too unless it is P, whose columns past the last whole vector are
    `tail_dot`s with tail_b (LANES, K), those columns of b along k (`lay_tail`). Where
    flags[5] is set, each block of c's columns then gets `finish` while it is in cache
    (residual's columns as c's)."""
    k_ = a.shape[1]
    p_ = b.shape[1]
    whole = p_ // LANES * LANES
    end = min(hi, whole)
    for j0 in range(lo, hi, NC):
        j1 = min(end, j0 + NC)
        tail = j0 + NC >= hi and hi == p_ and whole < p_
        for k0 in range(0, k_, KC):
            kc = min(KC, k_ - k0)
            for i in range(first, stop, ROWS):
                rows = min(ROWS, stop - i)
                for j in range(j0, j1, VECTORS * LANES):
                    vectors = min(VECTORS, (j1 - j) // LANES)
                    if k0 == 0:
                        tile(rows, vectors, a, i, k0, b, j, k0, c, i, shift + j, kc)
                    else:
                        tile_add(rows, vectors, a, i, k0, b, j, k0, c, i, shift + j, kc)
                if tail:
                    tail_dot(a, i, i + rows, k0, kc, tail_b, p_ - whole, c, shift + whole,
                             k0 > 0, zero)
        if flags[5] != 0:
            finish(c, first, stop, shift + j0, shift + (p_ if tail else j1), per_channel,
                   residual, flags, zero, channel0)


def stack_body(a, b, c, tail_b, parts, by_columns, per_channel, residual, flags, zero):
    """c[i] = a[i] @ b[i] for every matrix i of the stacks, each cut into `parts` parts
    of its rows (multiples of ROWS) or, `by_columns`, of its columns (multiples of a
    tile's), every (matrix, part) one iteration of a parallel loop. tail_b
    (n, LANES, K): each matrix's `part_body` tail. The epilogue
    (flags[5]): matrix i's rows are channels i M.., residual[i] theirs."""
    n_, m_ = a.shape[:2]
    p_ = b.shape[2]
    whole = p_ // LANES * LANES
    if whole < p_:
        for i in range(n_):
            lay_tail(b[i], tail_b[i])
    per = ((m_ + parts - 1) // parts + ROWS - 1) // ROWS * ROWS
    width = VECTORS * LANES
    units = (whole + width - 1) // width  # a tile's columns
    for t in prange(n_ * parts):
        i, q = t // parts, t % parts
        first, stop, lo, hi = 0, m_, 0, p_
        if by_columns:
            lo = min(whole, units * q // parts * width)
            hi = p_ if q == parts - 1 else min(whole, units * (q + 1) // parts * width)
        else:
            first, stop = min(m_, q * per), min(m_, q * per + per)
        if first < stop and lo < hi:
            part_body(a[i], b[i], c[i], first, stop, lo, hi, tail_b[i], per_channel,
                      residual[i], flags, zero, i * m_, 0)


def windows_body(x, w, c, geometries, rows, scratch, tail_b, parts, per_channel, residual,
                 flags, zero):
    """c (M, OH OW) = w (M, K) @ the windows of x (1, C, H, W), K = C kh kw in im2col's
    order, without ever writing them whole: the output rows in blocks of `rows`, block b
    unfolded by geometries[b] (its rows' own: padding moved, height) into a part's
    scratch (K, its rows OW), then multiplied there by part_body (and the epilogue,
    flags[5], residual (M, OH OW)), `parts` parts of the blocks at once on Numba's
    threads. tail_b (parts, LANES, K): each part's tail."""
    m_, k_ = w.shape
    blocks = geometries.shape[0]
    for q in prange(parts):
        for index in range(blocks * q // parts, blocks * (q + 1) // parts):
            g = geometries[index]
            height, ow_ = g[8], g[9]
            width = height * ow_
            window = scratch[q, :k_ * width]
            unfold(x, window.reshape((k_, height, ow_)), g, zero, 0, k_)
            cols = window.reshape((k_, width))
            lay_tail(cols, tail_b[q])
            part_body(w, cols, c, 0, m_, 0, width, tail_b[q], per_channel, residual, flags,
                      zero, 0, index * rows * ow_)


# ---------------------------------------------------------------- compilation


def compiled(dtype: np.dtype, parallel: bool = True, layout: str = "A") -> Any:
    """stack_body compiled for `dtype`, as a parallel loop or a plain one, for stacks of
    any strides ("A") or C-contiguous ones ("C": the epilogue's loops vectorize only
    where a row's stride is known), its tiles LLVM IR; cached on disk, once a process."""
    return jit.compiled_once((stack_body, dtype, parallel, layout, _lanes(dtype)), _make,
                             dtype, parallel, layout, parallel=parallel)


def _lanes(dtype: np.dtype) -> int:
    """Values per SIMD vector of the products' tiles: the widest vectors here."""
    return tiles.lanes(dtype, tiles.widest_bytes())


def _scope(dtype: np.dtype, parallel: bool) -> dict[str, Any]:
    """The kernel bodies' globals for dtype: the tiles' intrinsics, the helpers compiled
    (inlined), prange Numba's or range."""
    nb = jit.numba()
    scope: dict[str, Any] = dict(stack_body.__globals__)
    scope["LANES"] = _lanes(dtype)
    scope["prange"] = nb.prange if parallel else range
    width = tiles.widest_bytes()
    scope["tile"] = tiles.tile_switch_intrinsic(SHAPES, vector_bytes=width)
    scope["tile_add"] = tiles.tile_switch_intrinsic(SHAPES, accumulate=True, vector_bytes=width)
    scope["finished"] = nb.njit(inline="always", **jit.JIT_OPTIONS)(finished)
    scope["tail_dot"] = nb.njit(fastmath={"reassoc", "contract"}, **jit.JIT_OPTIONS)(tail_dot)
    for helper in (finish, part_body, lay_tail):
        scope[helper.__name__] = nb.njit(inline="always", **jit.JIT_OPTIONS)(
            jit.rebound(helper, scope))
    return scope


def _epilogue_types(dtype: np.dtype, residual: Any) -> tuple:
    """The types of the kernels' epilogue arguments (per_channel, residual, flags, zero)."""
    nb = jit.numba()
    return (jit.array_type(dtype, 2, "C", readonly=True), residual,
            jit.array_type(np.dtype(np.uint8), 1, "C", readonly=True), nb.from_dtype(dtype))


def _make(dtype: np.dtype, parallel: bool, layout: str) -> tuple[Any, tuple]:
    nb = jit.numba()
    signature = (jit.array_type(dtype, 3, layout, readonly=True),
                 jit.array_type(dtype, 3, layout, readonly=True),
                 jit.array_type(dtype, 3, layout),
                 jit.array_type(dtype, 3, "C"), nb.int64, nb.boolean,
                 *_epilogue_types(dtype, jit.array_type(dtype, 3, layout, readonly=True)))
    body = jit.rebound(stack_body, _scope(dtype, parallel))
    body.__qualname__ = (f"stack_body_{'parallel' if parallel else 'serial'}_{layout}"
                         f"_{_lanes(dtype)}")
    return jit.depending_on(body, tiles, epilogue_pass), signature


def windows_compiled(dtype: np.dtype, parallel: bool = True) -> Any:
    """windows_body compiled for `dtype`, as a parallel loop or a plain one; cached on
    disk, once a process."""
    return jit.compiled_once((windows_body, dtype, parallel, _lanes(dtype)), _make_windows,
                             dtype, parallel, parallel=parallel)


def _make_windows(dtype: np.dtype, parallel: bool) -> tuple[Any, tuple]:
    nb = jit.numba()
    scope = _scope(dtype, parallel)
    scope["unfold"] = conv_kernels.compiled(conv_kernels.unfold_body, dtype)
    signature = (jit.array_type(dtype, 4, "C", readonly=True),
                 jit.array_type(dtype, 2, "C", readonly=True),
                 jit.array_type(dtype, 2, "C"),
                 jit.array_type(np.dtype(np.int64), 2, "C", readonly=True), nb.int64,
                 jit.array_type(dtype, 2, "C"), jit.array_type(dtype, 3, "C"), nb.int64,
                 *_epilogue_types(dtype, jit.array_type(dtype, 2, "C", readonly=True)))
    body = jit.rebound(windows_body, scope)
    body.__qualname__ = f"windows_body_{'parallel' if parallel else 'serial'}_{_lanes(dtype)}"
    return jit.depending_on(body, tiles, epilogue_pass, conv_kernels), signature


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


class Epilogue(NamedTuple):
    """A convolution's epilogue, applied as the products store their results: per
    channel (a row of the stack's matrices, matrix i's channels i M..) a bias, a scale,
    a shift, then a residual (n, M, P), then relu; each but relu optional (None)."""

    bias: np.ndarray | None
    scale: np.ndarray | None
    shift: np.ndarray | None
    residual: np.ndarray | None
    relu: bool


def matmul(a: np.ndarray, b: np.ndarray, c: np.ndarray, threads: int,
           epilogue: Epilogue | None = None) -> np.ndarray:
    """c[i] = a[i] @ b[i]: a (n, M, K), b (n, K, P), c (n, M, P), one float dtype, each
    with unit-strided rows (any other strides), c overlapping neither operand; its work
    over `threads` threads at most; then `epilogue` on c, block by block while in
    cache. Returns c."""
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
    finishing = _finishing(epilogue, c)
    if k == 0:  # sums of nothing; the epilogue, if any, then runs on the zeros
        c[...] = 0
        if epilogue is None:
            return c
    lanes = _lanes(dtype)
    tail_b = np.empty((n, b.shape[2] % lanes, k), dtype)
    # One matrix a thread where the stack has enough of them to keep every thread busy;
    # else each matrix cut over the threads: by columns where b has at least twice a's
    # rows (each thread then reads all of a and its own part of b: ResNet-50's stem's
    # 147 x 12544 windows are read once, not once a thread: 2.47 -> 2.18 ms), else by
    # rows.
    by_columns = 2 * m <= b.shape[2] and b.shape[2] >= 2 * threads * VECTORS * lanes
    parts = 1 if n >= 2 * threads else max(1, min(threads, -(-m // ROWS)))
    if by_columns and n < 2 * threads:
        parts = threads
    layout = "C" if all(x.flags.c_contiguous for x in (a, b, c, finishing[1])) else "A"
    if threads > 1 and not _inherited:
        starting()
        compiled(dtype, True, layout)(a, b, c, tail_b, parts, by_columns, *finishing)
    else:
        compiled(dtype, False, layout)(a, b, c, tail_b, 1, False, *finishing)
    return c


# A part's windows (windows_matmul), in L2 with the weights (at most WEIGHT_BYTES: every
# block reads them all) and the block of results. With larger weights, or blocks
# narrower than NC columns (many channels: K = C kh kw large), im2col then `matmul` was
# faster (ResNet-50's 3x3 and 1x1 stride-2 convolutions: 1.04-2.1x the time fused), as
# it was where the windows fit in a part's scratch anyway.
WINDOW_BYTES = 512 * 1024
WEIGHT_BYTES = 64 * 1024


def windows_pay(m: int, k: int, pixels: int, dtype: np.dtype) -> bool:
    """Whether `windows_matmul` runs M x K weights on K x pixels windows (rather than
    im2col then `matmul`): small weights, many windows (a first layer: a stem's 64 x 147
    on 147 x 12544, 2.3 -> 1.7 ms, medians in turns)."""
    size = np.dtype(dtype).itemsize
    return (m * k * size <= WEIGHT_BYTES and k * pixels * size > 2 * WINDOW_BYTES
            and WINDOW_BYTES // max(1, k * size) >= NC)


def windows_matmul(x: np.ndarray, w: np.ndarray, c: np.ndarray, geometry: np.ndarray,
                   threads: int, epilogue: Epilogue | None = None) -> np.ndarray:
    """c (M, OH OW) = w (M, K) @ the windows of x (1, C, H, W) that im2col would write
    (pullback.kernels.conv.unfold; `geometry` theirs, laid out (1, C, kh, kw, OH, OW)
    C-contiguous; K = C kh kw), each block of output rows unfolded into a part's scratch
    (WINDOW_BYTES) and multiplied while it is in cache, never the whole: over `threads`
    threads at most, then `epilogue` (its residual (1, M, OH OW)) as the blocks are
    stored. Returns c."""
    dtype = check_dtype("windows_matmul", [x, w, c])
    kh, kw, sh, oh, ow = (int(geometry[i]) for i in (0, 1, 2, 8, 9))
    k = x.shape[1] * kh * kw if x.ndim == 4 else -1
    if x.ndim != 4 or len(x) != 1 or w.ndim != 2 or w.shape[1] != k or \
            c.shape != (w.shape[0], oh * ow):
        raise KernelError("windows_matmul", [x, w, c], f"expected x (1, C, H, W), w (M, C "
                          f"kh kw) and c (M, OH OW) for {kh}x{kw} windows on {oh}x{ow}")
    if not (x.flags.c_contiguous and w.flags.c_contiguous and c.flags.c_contiguous):
        raise KernelError("windows_matmul", [x, w, c], "every operand must be C-contiguous")
    if np.may_share_memory(c, x) or np.may_share_memory(c, w):
        raise KernelError("windows_matmul", [x, w, c], "the result must not overlap an operand")
    per_channel, residual, flags, zero = _finishing(epilogue, c[None])
    if c.size == 0:
        return c
    lanes = _lanes(dtype)
    rows = max(1, WINDOW_BYTES // (max(k, 1) * dtype.itemsize * ow))
    whole_vectors = lanes // math.gcd(ow, lanes)  # rows a block of whole vectors takes
    if rows >= whole_vectors:
        rows -= rows % whole_vectors
    blocks = -(-oh // rows)
    starts = np.arange(blocks, dtype=np.int64) * rows
    geometries = np.repeat(geometry[None], blocks, axis=0)
    geometries[:, 4] -= starts * sh  # block b's rows read x from row b rows sh - ph
    geometries[:, 8] = np.minimum(rows, oh - starts)
    parallel = threads > 1 and not _inherited
    parts = min(blocks, threads) if parallel else 1
    if parallel:
        starting()
    windows_compiled(dtype, parallel)(
        x, w, c, geometries, rows, np.empty((parts, k * rows * ow), dtype),
        np.empty((parts, lanes, k), dtype), parts, per_channel,
        np.ascontiguousarray(residual[0]), flags, zero)
    return c


def _finishing(epilogue: Epilogue | None, c: np.ndarray) -> tuple:
    """stack_body's epilogue arguments (per_channel, residual, flags, zero) for c."""
    dtype, (n, m) = c.dtype, c.shape[:2]
    flags = np.zeros(6, np.uint8)
    residual = np.empty((n, 0, 0), dtype)
    if epilogue is None:  # none of them is read: nothing the size of c's rows to make
        return np.empty((3, 0), dtype), residual, flags, dtype.type(0)
    flags[5] = 1
    per_channel = np.zeros((3, n * m), dtype)
    for row, v in enumerate((epilogue.bias, epilogue.scale, epilogue.shift)):
        if v is not None:
            if v.shape != (n * m,) or v.dtype != dtype:
                raise KernelError("matmul", [c, v], "an epilogue's per-channel values "
                                                    f"must be ({n * m},) {dtype}")
            flags[row] = 1
            per_channel[row] = v
    if epilogue.residual is not None:
        if epilogue.residual.shape != c.shape or epilogue.residual.dtype != dtype or (
                epilogue.residual.strides[2] != c.itemsize):
            raise KernelError("matmul", [c, epilogue.residual], "the residual must be "
                              f"{c.shape} {dtype}, its rows unit-strided")
        flags[3] = 1
        residual = epilogue.residual
    flags[4] = bool(epilogue.relu)
    return per_channel, residual, flags, dtype.type(0)
