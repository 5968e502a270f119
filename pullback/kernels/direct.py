"""Convolutions on small maps a sample at a time, in register tiles.

On a digits CNN's maps (8x8 into 6x6) a window row is 6 values long: im2col of the
whole batch spends more time per row than per value, and the GEMM's rows (a sample's
36 pixels) are too short for BLAS. Here each sample is copied into a zero-padded
buffer, its windows (C kh kw, OH OW) from there into a buffer that stays in L1
(`windows`), every window row moved in whole vectors (`move_run`: LLVM leaves loops
this short scalar, and Numba runs no SLP vectorizer), and the product with the
weights runs straight into the sample's output in register tiles
(pullback.kernels.tiles, `products`): the pixels are the tile's vectors, the output
channels its rows. Nothing is transposed and nothing the size of the batch's windows
is ever written. Each thread keeps its buffers from call to call (`_buffer`).

- forward: out[n] = W (O, C kh kw) @ windows(x[n]);
- input gradient: windows = W^T (C kh kw, O) @ upstream[n], folded back into the
  sample's gradient (`add_run`);
- weight gradient: grad^T (C kh kw, O) += windows of a few samples side by side
  (C kh kw, m OH OW) @ their upstream transposed (m OH OW, O), summed in the tiles'
  registers over the m samples' pixels.

Where a map's pixels are not a whole number of SIMD vectors, the buffers' rows are
padded with zeros to one (`Q` columns) and the results copied out of a scratch.
Stride 1, no dilation, one group (pullback.backend.conv chooses where this runs).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from pullback.kernels import jit, tiles

MOST_VECTORS = 4  # SIMD vectors of columns per tile
ROWS = (0, 8, 6, 4, 3)  # a tile's rows for 1-4 vectors: 8-12 accumulators
SHAPES = [(rows, vectors) for vectors in range(1, MOST_VECTORS + 1)
          for rows in range(1, ROWS[vectors] + 1)]


def columns(pixels: int, dtype: np.dtype) -> int:
    """Q: the pixels of a map rounded up to whole SIMD vectors."""
    lanes = tiles.lanes(dtype)
    return -(-pixels // lanes) * lanes


# ---------------------------------------------------------------- helpers (oracles)
# Plain-Python meanings; compiled, `copy_run`, `add_run` and `tile` are LLVM IR.


def copy_run(src, s, dst, d, count):
    """dst[d + t] = src[s + t] for t < count (1-D arrays)."""
    for t in range(count):
        dst[d + t] = src[s + t]


def move_run(src, s, dst, d, count):
    """dst[d + t] = src[s + t] for t < count, moved in whole SIMD vectors: up to a
    vector less one value past count is read and written too (both arrays have room)."""
    for t in range(count):
        dst[d + t] = src[s + t]


def add_run(src, s, dst, d, count):
    """dst[d + t] += src[s + t] for t < count (1-D arrays)."""
    for t in range(count):
        dst[d + t] += src[s + t]


def tile(rows, vectors, a, i, ka, b, jb, kb, c, ic, jc, k):
    """c[ic + r, jc + j] = sum over s < k of a[i + r, ka + s] b[kb + s, jb + j], for
    r < rows and j < vectors * lanes (pullback.kernels.tiles.tile_switch_intrinsic)."""
    for r in range(rows):
        for j in range(vectors * LANES):
            c[ic + r, jc + j] = 0
    tile_add(rows, vectors, a, i, ka, b, jb, kb, c, ic, jc, k)


def tile_add(rows, vectors, a, i, ka, b, jb, kb, c, ic, jc, k):
    """`tile`, adding to c's values."""
    for r in range(rows):
        for j in range(vectors * LANES):
            total = c[ic + r, jc + j]
            for s in range(k):
                total += a[i + r, ka + s] * b[kb + s, jb + j]
            c[ic + r, jc + j] = total


LANES = 8  # SIMD lanes of the dtype compiled for (rebound per dtype: `_make`)


# ---------------------------------------------------------------- shared loops


def products(a, b, c, k, add):
    """c (M, Q) = a[:, :k] @ b[:k] (or += with `add`), b (>= k, Q), Q a whole number of
    vectors: column blocks of at most MOST_VECTORS vectors, each block's rows ROWS at a
    time."""
    m = c.shape[0]
    vectors = c.shape[1] // LANES
    blocks = (vectors + MOST_VECTORS - 1) // MOST_VECTORS
    left, jb = vectors, 0
    for block in range(blocks):
        v = left // (blocks - block)
        rows = ROWS[v]
        for i in range(0, m, rows):
            if add:
                tile_add(min(rows, m - i), v, a, i, 0, b, jb, 0, c, i, jb, k)
            else:
                tile(min(rows, m - i), v, a, i, 0, b, jb, 0, c, i, jb, k)
        jb += v * LANES
        left -= v


def windows(xf, base, c_, h_, w_, padded, cols, col0, kh, kw, ph, pw, oh, ow):
    """cols[(c, i, j), col0 + y OW + t] = x[c, y + i - ph, t + j - pw] (zero in the
    padding) for the sample whose (C, H, W) values start at xf[base]. The sample is first
    copied into `padded` (C, H + 2 ph, W + 2 pw), whose borders stay zero, so that every
    window row is a whole run of OW values, moved in whole vectors (`move_run`): a run
    writes up to a vector's width past its end, into the runs written after it or into
    cols' slack (its rows are longer than the values read: SLACK)."""
    hp, wp = h_ + 2 * ph, w_ + 2 * pw
    flat = padded.reshape(padded.size)
    for c in range(c_):
        for h in range(h_):
            copy_run(xf, base + (c * h_ + h) * w_, flat, (c * hp + h + ph) * wp + pw, w_)
    k = 0
    for c in range(c_):
        for i in range(kh):
            for j in range(kw):
                row = cols[k]
                for y in range(oh):
                    move_run(flat, (c * hp + y + i) * wp + j, row, col0 + y * ow, ow)
                k += 1


# ---------------------------------------------------------------- kernel bodies


def forward_body(x, w, out, cols, scratch, padded, g):
    """out[n] = w @ windows(x[n]) for every sample: x (N, C, H, W), w (O, C kh kw), out
    (N, O, OH OW), cols (C kh kw, Q) with SLACK after it, scratch (O, Q) (used where
    Q > OH OW), padded `windows`' zeros; g = (kh, kw, ph, pw, oh, ow)."""
    kh, kw, ph, pw, oh, ow = g[0], g[1], g[2], g[3], g[4], g[5]
    n_, c_, h_, w_ = x.shape
    xf = x.reshape(x.size)
    pixels = oh * ow
    k = cols.shape[0]
    for n in range(n_):
        windows(xf, n * c_ * h_ * w_, c_, h_, w_, padded, cols, 0, kh, kw, ph, pw, oh, ow)
        if cols.shape[1] == pixels:
            products(w, cols, out[n], k, False)
        else:
            products(w, cols, scratch, k, False)
            for o in range(out.shape[1]):
                copy_run(scratch[o], 0, out[n, o], 0, pixels)


def input_backward_body(up, wt, grad, cols, scratch, g):
    """grad[n] = the windows wt @ up[n] folded back, for every sample: up (N, O, OH OW),
    wt (C kh kw, O), grad (N, C, H, W), cols (C kh kw, Q), scratch (O, Q) zeros (the
    upstream padded to Q columns where Q > OH OW)."""
    kh, kw, ph, pw, oh, ow = g[0], g[1], g[2], g[3], g[4], g[5]
    n_, c_, h_, w_ = grad.shape
    pixels = oh * ow
    gf = grad.reshape(grad.size)
    o_ = up.shape[1]
    for n in range(n_):
        if cols.shape[1] == pixels:
            products(wt, up[n], cols, o_, False)
        else:
            for o in range(o_):
                copy_run(up[n, o], 0, scratch[o], 0, pixels)
            products(wt, scratch, cols, o_, False)
        base = n * c_ * h_ * w_
        for at in range(base, base + c_ * h_ * w_):
            gf[at] = 0
        k = 0
        for c in range(c_):
            for i in range(kh):
                for j in range(kw):
                    lo = max(0, pw - j)
                    hi = min(ow, w_ + pw - j)
                    row = cols[k]
                    for y in range(oh):
                        hy = y + i - ph
                        if 0 <= hy < h_ and hi > lo:
                            add_run(row, y * ow + lo, gf, base + (c * h_ + hy) * w_ + lo + j - pw,
                                    hi - lo)
                    k += 1


def weight_backward_body(up, x, grad_t, cols, up_t, padded, g):
    """grad_t (C kh kw, Q) += windows(x[n]) @ up[n]^T summed over the samples, m at a
    time (m = up_t's rows / OH OW): up (N, O, OH OW), x (N, C, H, W), cols
    (C kh kw, m OH OW + SLACK), up_t (m OH OW, Q) zeros, padded `windows`' zeros;
    Q >= O."""
    kh, kw, ph, pw, oh, ow = g[0], g[1], g[2], g[3], g[4], g[5]
    n_, c_, h_, w_ = x.shape
    o_ = up.shape[1]
    pixels = oh * ow
    most = up_t.shape[0] // pixels
    xf = x.reshape(x.size)
    for first in range(0, n_, most):
        m = min(most, n_ - first)
        for s in range(m):
            windows(xf, (first + s) * c_ * h_ * w_, c_, h_, w_, padded, cols, s * pixels,
                    kh, kw, ph, pw, oh, ow)
            for o in range(o_):
                for p in range(pixels):
                    up_t[s * pixels + p, o] = up[first + s, o, p]
        products(cols, up_t, grad_t, m * pixels, True)


# ---------------------------------------------------------------- compilation

def compiled(body: Any, dtype: np.dtype) -> Any:
    """`body` compiled for `dtype`, its helpers LLVM IR; cached on disk, once a process."""
    return jit.compiled_once((body, dtype), _make, body, dtype)


def _make(body: Any, dtype: np.dtype) -> tuple[Any, tuple]:
    nb = jit.numba()
    inline = {"inline": "always", **jit.JIT_OPTIONS}
    scope: dict[str, Any] = dict(body.__globals__)
    scope["LANES"] = tiles.lanes(dtype)
    scope["copy_run"] = _run_intrinsic("copy")
    scope["move_run"] = _run_intrinsic("move")
    scope["add_run"] = _run_intrinsic("add")
    scope["tile"] = tiles.tile_switch_intrinsic(SHAPES)
    scope["tile_add"] = tiles.tile_switch_intrinsic(SHAPES, accumulate=True)
    for helper in (products, windows):
        scope[helper.__name__] = nb.njit(**inline)(jit.rebound(helper, scope))
    arrays = {forward_body: "4i 2i 3o 2o 2o 1o", input_backward_body: "3i 2i 4o 2o 2o",
              weight_backward_body: "3i 4i 2o 2o 2o 1o"}[body]
    signature = tuple(jit.array_type(dtype, int(a[0]), "C", readonly=a[1] == "i")
                      for a in arrays.split())
    signature += (jit.array_type(np.dtype(np.int64), 1, "C", readonly=True),)
    return jit.depending_on(jit.rebound(jit.in_precision(body, dtype), scope), tiles), signature


def _run_intrinsic(kind: str) -> Any:
    """`copy_run`, `add_run` or `move_run` as a Numba intrinsic. copy and add: runs of up
    to 8 values, one masked vector load and store each (two loads and an add for
    `add_run`), a run of 4 or fewer in a 4-lane vector; longer runs loop. move: whole
    256-bit vectors, unmasked (a masked store costs several times a plain one here)."""
    add = kind == "add"
    from llvmlite import ir  # type: ignore[import-untyped]  # llvmlite ships no type information
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def typer(typingctx, src, s, dst, d, count):
        return types.void(src, types.intp, dst, types.intp, types.intp), codegen

    def codegen(context, builder, signature, args):
        src, s, dst, d, count = args
        sty = signature.args[0]
        ps = jit.item_pointer(context, builder, sty, src, s)
        pd = jit.item_pointer(context, builder, signature.args[2], dst, d)
        scalar = context.get_value_type(sty.dtype)
        size = np.dtype(str(sty.dtype)).itemsize
        i1, i32, i64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)

        def move(width: int, src_at: Any, dst_at: Any, left: Any) -> None:
            vec = ir.VectorType(scalar, width)
            vptr = vec.as_pointer()
            lanes = ir.Constant(ir.VectorType(i64, width), list(range(width)))
            spread = builder.shuffle_vector(
                builder.insert_element(ir.Constant(ir.VectorType(i64, width), ir.Undefined),
                                       left, ir.Constant(i32, 0)),
                ir.Constant(ir.VectorType(i64, width), ir.Undefined),
                ir.Constant(ir.VectorType(i32, width), [0] * width))
            mask = builder.icmp_signed("<", lanes, spread)
            mty = ir.VectorType(i1, width)
            suffix = f"v{width}f{8 * size}.p0v{width}f{8 * size}"
            load = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vptr, i32, mty, vec]),
                f"llvm.masked.load.{suffix}")
            store = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [vec, vptr, i32, mty]),
                f"llvm.masked.store.{suffix}")
            align = ir.Constant(i32, size)
            zero = ir.Constant(vec, None)
            value = builder.call(load, [builder.bitcast(src_at, vptr), align, mask, zero])
            to = builder.bitcast(dst_at, vptr)
            if add:
                value = builder.fadd(value, builder.call(load, [to, align, mask, zero]))
            builder.call(store, [value, to, align, mask])

        def plain(width: int, src_at: Any, dst_at: Any) -> None:  # unmasked, whole
            vptr = ir.VectorType(scalar, width).as_pointer()
            value = builder.load(builder.bitcast(src_at, vptr), align=size)
            builder.store(value, builder.bitcast(dst_at, vptr), align=size)

        # Whole vectors while more than one is left, then the rest: for `move_run` one
        # more whole vector (as wide as a 256-bit one); for the others one masked
        # vector of 8 or, for 4 values or fewer, of 4 lanes.
        step = 32 // size if kind == "move" else 8
        entry = builder.basic_block
        loop = builder.append_basic_block("run_loop")
        tail = builder.append_basic_block("run_tail")
        builder.cbranch(builder.icmp_signed(">", count, ir.Constant(i64, step)), loop, tail)
        builder.position_at_end(loop)
        done = builder.phi(i64)
        done.add_incoming(ir.Constant(i64, 0), entry)
        whole = ir.Constant(i64, step)
        if kind == "move":
            plain(step, builder.gep(ps, [done]), builder.gep(pd, [done]))
        else:
            move(step, builder.gep(ps, [done]), builder.gep(pd, [done]), whole)
        following = builder.add(done, whole)
        done.add_incoming(following, loop)
        builder.cbranch(builder.icmp_signed(">", builder.sub(count, following), whole), loop,
                        tail)
        builder.position_at_end(tail)
        moved = builder.phi(i64)
        moved.add_incoming(ir.Constant(i64, 0), entry)
        moved.add_incoming(following, loop)
        end = builder.append_basic_block("run_end")
        if kind == "move":
            plain(step, builder.gep(ps, [moved]), builder.gep(pd, [moved]))
            builder.branch(end)
        else:
            left = builder.sub(count, moved)
            wide = builder.append_basic_block("run_8")
            narrow = builder.append_basic_block("run_4")
            builder.cbranch(builder.icmp_signed(">", left, ir.Constant(i64, 4)), wide, narrow)
            for block, width in ((wide, 8), (narrow, 4)):
                builder.position_at_end(block)
                move(width, builder.gep(ps, [moved]), builder.gep(pd, [moved]), left)
                builder.branch(end)
        builder.position_at_end(end)
        return context.get_dummy_value()

    return intrinsic(typer)


# ---------------------------------------------------------------- entry points
# Callers (pullback.backend.conv) validate shapes and geometry; these only run loops.

WEIGHT_WINDOWS_BYTES = 128 << 10  # the weight gradient's windows of m samples: in L2
SLACK = 8  # values past a buffer's end that `move_run` may write or read


def geometry(kernel: tuple[int, int], padding: tuple[int, int],
             out_hw: tuple[int, int]) -> np.ndarray:
    return np.array([*kernel, *padding, *out_hw], np.int64)


def forward(x: np.ndarray, w: np.ndarray, out: np.ndarray, g: np.ndarray) -> np.ndarray:
    """out (N, O, OH, OW) = x (N, C, H, W) correlated with w (O, C, kh, kw), C-contiguous
    arrays of one float dtype; returns out."""
    o, pixels = w.shape[0], int(g[4] * g[5])
    q = columns(pixels, x.dtype)
    k = w[0].size
    cols = _buffer("cols", k * q, x.dtype).reshape(k, q)
    scratch = _buffer("scratch", o * q, x.dtype).reshape(o, q) if q > pixels else cols
    compiled(forward_body, x.dtype)(x, w.reshape(o, -1), out.reshape(len(out), o, pixels),
                                    cols, scratch, _padded(x, g), g)
    return out


_KEPT = threading.local()  # .buffers: this thread's buffers by role, size and dtype


def _buffer(role: str, size: int, dtype: np.dtype) -> np.ndarray:
    """This thread's buffer of `size` values (and SLACK more) for `role`, zeros when made
    and kept from call to call: the kernels write a buffer's zeros (padding, columns past
    a map's pixels) nowhere, and the rest before they read it."""
    kept = getattr(_KEPT, "buffers", None)
    if kept is None:
        kept = _KEPT.buffers = {}
    key = (role, size, np.dtype(dtype))
    found = kept.get(key)
    if found is None:
        if len(kept) >= 64:  # more shapes than a model has: start over
            kept.clear()
        found = kept[key] = np.zeros(size + SLACK, dtype)
    return found[:size]


def _padded(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """`windows`' buffer for a sample of x padded by g's padding (its borders zeros)."""
    c, h, w = x.shape[1:]
    ph, pw = int(g[2]), int(g[3])
    # Kept by the sample's shape and padding: those place the borders.
    return _buffer(f"padded {c}x{h}x{w}+{ph}x{pw}", c * (h + 2 * ph) * (w + 2 * pw), x.dtype)


def input_backward(up: np.ndarray, w: np.ndarray, grad: np.ndarray, g: np.ndarray
                   ) -> np.ndarray:
    """grad (N, C, H, W) of the correlation of x with w (O, C, kh, kw) for the upstream
    up (N, O, OH, OW); returns grad."""
    o, pixels = w.shape[0], int(g[4] * g[5])
    q = columns(pixels, up.dtype)
    wt = np.ascontiguousarray(w.reshape(o, -1).T)
    scratch = _buffer("upstream", o * q, up.dtype).reshape(o, q) if q > pixels else wt
    cols = _buffer("cols", wt.shape[0] * q, up.dtype).reshape(-1, q)
    compiled(input_backward_body, up.dtype)(up.reshape(len(up), o, pixels), wt, grad, cols,
                                            scratch, g)
    return grad


def weight_backward(up: np.ndarray, x: np.ndarray, weight_shape: tuple[int, ...],
                    g: np.ndarray) -> np.ndarray:
    """The gradient (O, C, kh, kw) of the correlation of x (N, C, H, W) with a weight
    for the upstream up (N, O, OH, OW)."""
    o, pixels = weight_shape[0], int(g[4] * g[5])
    k = int(np.prod(weight_shape[1:]))
    q = columns(o, x.dtype)
    most = max(1, min(len(x), WEIGHT_WINDOWS_BYTES // (k * pixels * x.itemsize)))
    grad_t = np.zeros((k, q), x.dtype)
    width = most * pixels + SLACK
    cols = _buffer("windows", k * width, x.dtype).reshape(k, width)
    up_t = _buffer(f"upstream {q}", most * pixels * q, x.dtype).reshape(-1, q)
    compiled(weight_backward_body, x.dtype)(up.reshape(len(up), o, pixels), x, grad_t, cols,
                                            up_t, _padded(x, g), g)
    return np.ascontiguousarray(grad_t[:, :o].T).reshape(weight_shape)
