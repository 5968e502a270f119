"""Matrix products C = A B whose right operand B is packed once and read many times:
a recurrence's weight, multiplied by every step's state.

BLAS packs both operands into its own layout on every call. For a product of a few
rows (an LSTM step's 32 x 256 state times its 256 x 1024 weight) that repacking is a
third of the call, and one thread ran it at 73 GFLOP/s where this runs it at 94-99. Here
B is packed once (`pack`): panels of NR columns, each panel's K rows of NR values
contiguous, so one pass over a panel reads memory in order. The product then walks the
panels, and in each the rows of A four at a time: a tile of 4 x NR results is held in
12 SIMD registers (3 vectors a row, of 512 bits where the CPU has AVX-512, else 256: NR =
48 or 24 float32, 24 or 12 float64; the wider ones took an LSTM step's 32 x 256 x 1024
product 0.85-0.9x the time, medians) while k runs over A's columns, each step one vector
load per B vector, one broadcast per A row and 12 fused multiply-adds (`tile`). Each
result is its row of A times its column of B summed in k order: the same bits whichever
rows a caller passes together.

`tile` is a plain-Python oracle; compiled, it is LLVM IR written here (a Numba
intrinsic per number of rows, 1 to 4), since LLVM does not find this register tiling
in a loop nest by itself (it spills the tile, or vectorizes nothing). One file on
purpose: Numba's disk cache notices an edit to a kernel's own file only.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from pullback.errors import KernelError
from pullback.kernels import jit
from pullback.kernels.conv import check_dtype

MR = 4  # rows of A (and of C) per tile
VECTORS = 3  # SIMD vectors per tile row: 12 accumulators, 2 registers of AVX2's 16 left
VECTOR_BYTES = 32  # 256 bits
WIDE_BYTES = 64  # AVX-512's 512 bits


@functools.cache
def widest_bytes() -> int:
    """The widest SIMD vector Numba compiles for here, in bytes: WIDE_BYTES where its
    target (the host, unless NUMBA_CPU_NAME names another) has AVX-512F, else
    VECTOR_BYTES."""
    config = jit.numba().config
    if config.CPU_NAME and config.CPU_NAME != "host":
        return WIDE_BYTES if "+avx512f" in (config.CPU_FEATURES or "") else VECTOR_BYTES
    from llvmlite import binding  # type: ignore[import-untyped]

    return WIDE_BYTES if binding.get_host_cpu_features().get("avx512f") else VECTOR_BYTES


def lanes(dtype: np.dtype, vector_bytes: int = VECTOR_BYTES) -> int:
    """Values per SIMD vector: 8 float32, 4 float64 (of 256 bits)."""
    return vector_bytes // np.dtype(dtype).itemsize


def panel_width(dtype: np.dtype) -> int:
    """NR, the columns of B per packed panel (and of C per tile): VECTORS of the widest
    vectors here (`widest_bytes`), 48 float32 and 24 float64 with AVX-512, else 24 and
    12."""
    return VECTORS * lanes(dtype, widest_bytes())


class Packed(NamedTuple):
    """B (K, N) packed (`pack`): `panels` (ceil(N / NR), K, NR), panel p holding
    columns p NR.. of every row, the last one padded with zeros; `columns` N."""

    panels: np.ndarray
    columns: int


def pack(b: np.ndarray) -> Packed:
    """B (K, N) packed for `product`."""
    dtype = check_dtype("pack", [b])
    if b.ndim != 2:
        raise KernelError("pack", [b], "expected a matrix (K, N)")
    k, n = b.shape
    nr = panel_width(dtype)
    full, count = n // nr, -(-n // nr)
    panels = np.zeros((count, k, nr), dtype)
    panels[:full] = b[:, :full * nr].reshape(k, full, nr).transpose(1, 0, 2)
    if full < count:
        panels[full, :, :n - full * nr] = b[:, full * nr:]
    return Packed(panels, n)


def product(a: np.ndarray, b: Packed, out: np.ndarray) -> np.ndarray:
    """out (M, N) = a (M, K) @ B, B `pack`ed; a and out C-contiguous (a block of rows
    of a larger C-contiguous array is), one float dtype."""
    panels = b.panels
    dtype = check_dtype("packed_product", [a, panels, out])
    if (a.ndim != 2 or out.ndim != 2 or out.shape != (a.shape[0], b.columns)
            or panels.shape[1] != a.shape[1]):
        raise KernelError("packed_product", [a, panels, out],
                          f"expected a (M, K) and out (M, N) for B (K, N) = "
                          f"({panels.shape[1]}, {b.columns})")
    if not (a.flags.c_contiguous and out.flags.c_contiguous and panels.flags.c_contiguous):
        raise KernelError("packed_product", [a, panels, out],
                          "a, out and B's panels must be C-contiguous")
    if out.size:
        compiled(dtype)(a, panels, out, edge_buffer(panels))
    return out


def edge_buffer(panels: np.ndarray) -> np.ndarray:
    """A tile's scratch for the panel past the result's last column."""
    return np.empty((MR, panels.shape[2]), panels.dtype)


# ---------------------------------------------------------------- kernel bodies


def tile(rows, a, i, ka, b, panel, kb, c, ic, jc, k):
    """c[ic + r, jc + j] = sum over s < k of a[i + r, ka + s] b[panel, kb + s, j], for
    r < rows (1 to MR) and j < NR (b's panel width): a and c 2-D, unit-strided along
    their rows; b packed panels. Compiled: LLVM IR (`_tile_intrinsic`)."""
    for r in range(rows):
        for j in range(b.shape[2]):
            total = a.dtype.type(0)
            for s in range(k):
                total += a[i + r, ka + s] * b[panel, kb + s, j]
            c[ic + r, jc + j] = total


def store_tile(rows, a, i, ka, b, panel, kb, c, ic, jc, cols, k, edge):
    """`tile` into c's columns jc..jc + cols (cols <= NR): straight into c for a whole
    panel, through `edge` (MR x NR) and copied for a panel past c's last column."""
    if cols == b.shape[2]:
        tile(rows, a, i, ka, b, panel, kb, c, ic, jc, k)
    else:
        tile(rows, a, i, ka, b, panel, kb, edge, 0, 0, k)
        for r in range(rows):
            for j in range(cols):
                c[ic + r, jc + j] = edge[r, j]


def product_body(a, packed, out, edge):
    """out = a @ B over B's panels, MR rows of a at a time."""
    m, k = a.shape
    n = out.shape[1]
    nr = packed.shape[2]
    for p in range(packed.shape[0]):
        for i in range(0, m, MR):
            store_tile(min(MR, m - i), a, i, 0, packed, p, 0, out, i, p * nr,
                       min(nr, n - p * nr), k, edge)


# ---------------------------------------------------------------- compilation


def compiled(dtype: np.dtype) -> Any:
    """product_body compiled for `dtype`, `tile` as LLVM IR; cached on disk, once per
    process."""
    return jit.compiled_once((product_body, dtype, widest_bytes()), _make, dtype)


def body_in(dtype: np.dtype) -> Any:
    """product_body for `dtype`, its tiles bound but the body not compiled: for a
    kernel that calls it (a recurrence's, once a step), compiled into that kernel."""
    return _make(dtype)[0]


def _make(dtype: np.dtype) -> tuple[Any, tuple]:
    """product_body in `dtype`, `tile` the intrinsics (one per row count) and
    store_tile compiled into it."""
    nb = jit.numba()
    one, two, three, four = (tile_intrinsic(rows, vector_bytes=widest_bytes())
                             for rows in range(1, MR + 1))

    @nb.njit(inline="always", **jit.JIT_OPTIONS)
    def compiled_tile(rows, a, i, ka, b, panel, kb, c, ic, jc, k):
        if rows == 4:
            four(a, i, ka, b, panel, kb, c, ic, jc, k)
        elif rows == 3:
            three(a, i, ka, b, panel, kb, c, ic, jc, k)
        elif rows == 2:
            two(a, i, ka, b, panel, kb, c, ic, jc, k)
        else:
            one(a, i, ka, b, panel, kb, c, ic, jc, k)

    scope = dict(product_body.__globals__, tile=compiled_tile)
    scope["store_tile"] = nb.njit(inline="always", **jit.JIT_OPTIONS)(
        jit.rebound(store_tile, scope))
    signature = (jit.array_type(dtype, 2, "C", readonly=True),
                 jit.array_type(dtype, 3, "C", readonly=True),
                 jit.array_type(dtype, 2, "C"), jit.array_type(dtype, 2, "C"))
    body = jit.rebound(product_body, scope)
    body.__qualname__ = f"product_body_{widest_bytes()}"  # its disk cache's, per width
    return body, signature


def tile_intrinsic(rows: int, vectors: int = VECTORS, vector_bytes: int = VECTOR_BYTES) -> Any:
    """`tile` for `rows` rows and `vectors` SIMD vectors of columns as a Numba
    intrinsic: the loop over k in LLVM IR, the tile's rows x vectors accumulators in
    SIMD registers (phi nodes), one fused multiply-add (llvm.fma) per accumulator and k;
    a's, b's and c's rows addressed through their row strides. b is either packed
    panels (P, K, NR), `panel` choosing one, or a matrix (K, N) whose columns from
    `panel` on are read (pullback.kernels.direct's windows)."""
    from numba import types
    from numba.extending import intrinsic

    def typer(typingctx, a, i, ka, b, panel, kb, c, ic, jc, k):
        sig = types.void(a, types.intp, types.intp, b, types.intp, types.intp, c,
                         types.intp, types.intp, types.intp)
        return sig, codegen

    def codegen(context, builder, signature, args):
        _emit_tile(context, builder, signature.args, args, rows, vectors, False, vector_bytes)
        return context.get_dummy_value()

    return intrinsic(typer)


def tile_switch_intrinsic(shapes: Sequence[tuple[int, int]], accumulate: bool = False,
                          vector_bytes: int = VECTOR_BYTES) -> Any:
    """`tile` as one intrinsic taking its shape at run time: tile(rows, vectors, a, i,
    ka, b, panel, kb, c, ic, jc, k) runs `tile_intrinsic(rows, vectors)`'s loop for
    each (rows, vectors) in `shapes` (a switch in LLVM IR), nothing for any other. With
    `accumulate` the tile adds its products to c's values instead of replacing them. Its
    vectors are `vector_bytes` wide (`lanes(dtype, vector_bytes)` values)."""
    from llvmlite import ir  # type: ignore[import-untyped]
    from numba import types
    from numba.extending import intrinsic

    def typer(typingctx, rows, vectors, a, i, ka, b, panel, kb, c, ic, jc, k):
        sig = types.void(types.intp, types.intp, a, types.intp, types.intp, b, types.intp,
                         types.intp, c, types.intp, types.intp, types.intp)
        return sig, codegen

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        case = builder.add(builder.mul(args[1], ir.Constant(i64, 256)), args[0])
        end = builder.append_basic_block("tile_end")
        switch = builder.switch(case, end)
        for rows, vectors in shapes:
            block = builder.append_basic_block(f"tile_{rows}x{vectors}")
            switch.add_case(ir.Constant(i64, vectors * 256 + rows), block)
            builder.position_at_end(block)
            _emit_tile(context, builder, signature.args[2:], args[2:], rows, vectors,
                       accumulate, vector_bytes)
            builder.branch(end)
        builder.position_at_end(end)
        return context.get_dummy_value()

    return intrinsic(typer)


def _emit_tile(context: Any, builder: Any, types_: Sequence[Any], args: Sequence[Any],
               rows: int, vectors: int, accumulate: bool = False,
               vector_bytes: int = VECTOR_BYTES) -> None:
    """The IR of one `tile` of rows x vectors (`tile_intrinsic`), from the builder's
    block; the builder is left after the tile's stores. `accumulate`: the sums start
    from c's values, not zero."""
    from llvmlite import ir  # type: ignore[import-untyped]  # llvmlite ships no type information
    from numba.core import cgutils

    a, i, ka, b, panel, kb, c, ic, jc, k = args
    aty, bty, cty = types_[0], types_[3], types_[6]
    arrays = [context.make_array(ty)(context, builder, value)
              for ty, value in ((aty, a), (bty, b), (cty, c))]
    pa = cgutils.get_item_pointer(context, builder, aty, arrays[0], [i, ka])
    packed = bty.ndim == 3
    at = [panel, kb, ir.Constant(ir.IntType(64), 0)] if packed else [kb, panel]
    pb = cgutils.get_item_pointer(context, builder, bty, arrays[1], at)
    pc = cgutils.get_item_pointer(context, builder, cty, arrays[2], [ic, jc])
    a_step = cgutils.unpack_tuple(builder, arrays[0].strides)[0]  # bytes
    c_step = cgutils.unpack_tuple(builder, arrays[2].strides)[0]
    b_step = cgutils.unpack_tuple(builder, arrays[1].strides)[1 if packed else 0]
    dtype = np.dtype(str(aty.dtype))
    width, align = lanes(dtype, vector_bytes), dtype.itemsize
    scalar = context.get_value_type(aty.dtype)
    vec = ir.VectorType(scalar, width)
    vptr, sptr = vec.as_pointer(), scalar.as_pointer()
    i64, i8p = ir.IntType(64), ir.IntType(8).as_pointer()

    def row(base: Any, step: Any, r: Any) -> Any:  # row r (an int or i64) of a, b or c
        index = ir.Constant(i64, r) if isinstance(r, int) else r
        moved = builder.gep(builder.bitcast(base, i8p), [builder.mul(index, step)])
        return builder.bitcast(moved, sptr)

    name = f"llvm.fma.v{width}f{8 * align}"
    fma = cgutils.get_or_insert_function(builder.module,
                                         ir.FunctionType(vec, [vec, vec, vec]), name)
    zero = ir.Constant(vec, None)
    splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width)
    a_rows = [row(pa, a_step, r) for r in range(rows)]
    c_at = [builder.bitcast(builder.gep(row(pc, c_step, r), [ir.Constant(i64, v * width)]), vptr)
            for r in range(rows) for v in range(vectors)]
    start = [builder.load(at, align=align) for at in c_at] if accumulate else \
        [zero] * (rows * vectors)
    entry = builder.basic_block
    loop = builder.append_basic_block("tile_k")
    done = builder.append_basic_block("tile_store")
    builder.cbranch(builder.icmp_signed(">", k, ir.Constant(i64, 0)), loop, done)

    builder.position_at_end(loop)
    step = builder.phi(i64)
    step.add_incoming(ir.Constant(i64, 0), entry)
    acc = [builder.phi(vec) for _ in range(rows * vectors)]
    for phi, first in zip(acc, start):
        phi.add_incoming(first, entry)
    b_row = row(pb, b_step, step)
    bv = [builder.load(builder.bitcast(builder.gep(b_row, [ir.Constant(i64, v * width)]),
                                       vptr), align=align) for v in range(vectors)]
    summed = []
    for r in range(rows):
        x = builder.load(builder.gep(a_rows[r], [step]), align=align)
        splat = builder.shuffle_vector(
            builder.insert_element(ir.Constant(vec, ir.Undefined), x,
                                   ir.Constant(ir.IntType(32), 0)),
            ir.Constant(vec, ir.Undefined), splat_mask)
        summed += [builder.call(fma, [splat, bv[v], acc[r * vectors + v]])
                   for v in range(vectors)]
    following = builder.add(step, ir.Constant(i64, 1))
    step.add_incoming(following, loop)
    for phi, value in zip(acc, summed):
        phi.add_incoming(value, loop)
    builder.cbranch(builder.icmp_signed("<", following, k), loop, done)

    builder.position_at_end(done)
    results = []
    for value, first in zip(summed, start):  # (a block's phi nodes come first)
        phi = builder.phi(vec)
        phi.add_incoming(first, entry)
        phi.add_incoming(value, loop)
        results.append(phi)
    for value, at in zip(results, c_at):
        builder.store(value, at, align=align)

