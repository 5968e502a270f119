"""Matrix products C = A B whose right operand B is packed once and read many times:
a recurrence's weight, multiplied by every step's state.

BLAS packs both operands into its own layout on every call. For a product of a few
rows (an LSTM step's 32 x 256 state times its 256 x 1024 weight) that repacking is a
third of the call, and one thread ran it at 73 GFLOP/s where this runs it at 99. Here
B is packed once (`pack`): panels of NR columns, each panel's K rows of NR values
contiguous, so one pass over a panel reads memory in order. The product then walks the
panels, and in each the rows of A four at a time: a tile of 4 x NR results is held in
12 SIMD registers (3 vectors of 256 bits a row: NR = 24 float32 or 12 float64) while k
runs over A's columns, each step one vector load per B vector, one broadcast per A
row and 12 fused multiply-adds (`tile`). Each result is its row of A times its column
of B summed in k order: the same bits whichever rows a caller passes together.

`tile` is a plain-Python oracle; compiled, it is LLVM IR written here (a Numba
intrinsic per number of rows, 1 to 4), since LLVM does not find this register tiling
in a loop nest by itself (it spills the tile, or vectorizes nothing). One file on
purpose: Numba's disk cache notices an edit to a kernel's own file only.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from pullback.errors import KernelError
from pullback.kernels import jit
from pullback.kernels.conv import check_dtype

MR = 4  # rows of A (and of C) per tile
VECTORS = 3  # SIMD vectors per tile row: 12 accumulators, 2 registers of AVX2's 16 left
VECTOR_BYTES = 32  # 256 bits


def lanes(dtype: np.dtype) -> int:
    """Values per SIMD vector: 8 float32, 4 float64."""
    return VECTOR_BYTES // np.dtype(dtype).itemsize


def panel_width(dtype: np.dtype) -> int:
    """NR, the columns of B per packed panel (and of C per tile): 24 float32, 12 float64."""
    return VECTORS * lanes(dtype)


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
    if not (a.flags.c_contiguous and out.flags.c_contiguous):
        raise KernelError("packed_product", [a, panels, out], "a and out must be C-contiguous")
    if out.size:
        compiled(dtype)(a, panels, out, edge(panels))
    return out


def edge(panels: np.ndarray) -> np.ndarray:
    """A tile's scratch for the panel past the result's last column."""
    return np.empty((MR, panels.shape[2]), panels.dtype)


# ---------------------------------------------------------------- kernel bodies


def tile(rows, a, a_off, lda, b, b_off, ldb, c, c_off, ldc, k):
    """c[c_off + r ldc + j] = sum over i < k of a[a_off + r lda + i] b[b_off + i ldb + j],
    for r < rows (1 to MR) and j < ldb's panel width NR; flat arrays. Compiled: LLVM IR
    (`_tile_intrinsic`)."""
    nr = panel_width(b.dtype)
    for r in range(rows):
        for j in range(nr):
            total = a.dtype.type(0)
            for i in range(k):
                total += a[a_off + r * lda + i] * b[b_off + i * ldb + j]
            c[c_off + r * ldc + j] = total


def product_body(a, packed, out, edge):
    """out = a @ B over B's panels, MR rows of a at a time; a panel past out's last
    column goes through `edge` and only out's columns are copied."""
    m, k = a.shape
    n = out.shape[1]
    nr = packed.shape[2]
    af, pf, of, ef = a.reshape(-1), packed.reshape(-1), out.reshape(-1), edge.reshape(-1)
    for p in range(packed.shape[0]):
        j0 = p * nr
        for i0 in range(0, m, MR):
            rows = min(MR, m - i0)
            if j0 + nr <= n:
                tile(rows, af, i0 * k, k, pf, p * k * nr, nr, of, i0 * n + j0, n, k)
            else:
                tile(rows, af, i0 * k, k, pf, p * k * nr, nr, ef, 0, nr, k)
                for r in range(rows):
                    for j in range(n - j0):
                        out[i0 + r, j0 + j] = edge[r, j]


# ---------------------------------------------------------------- compilation


def compiled(dtype: np.dtype) -> Any:
    """product_body compiled for `dtype`, `tile` as LLVM IR; cached on disk, once per
    process."""
    return jit.compiled_once((product_body, dtype), _make, dtype)


def _make(dtype: np.dtype) -> tuple[Any, tuple]:
    import types

    nb = jit.numba()
    one, two, three, four = (_tile_intrinsic(rows) for rows in range(1, MR + 1))

    @nb.njit(inline="always", **jit.JIT_OPTIONS)
    def compiled_tile(rows, a, a_off, lda, b, b_off, ldb, c, c_off, ldc, k):
        if rows == 4:
            four(a, a_off, lda, b, b_off, ldb, c, c_off, ldc, k)
        elif rows == 3:
            three(a, a_off, lda, b, b_off, ldb, c, c_off, ldc, k)
        elif rows == 2:
            two(a, a_off, lda, b, b_off, ldb, c, c_off, ldc, k)
        else:
            one(a, a_off, lda, b, b_off, ldb, c, c_off, ldc, k)

    scope = dict(product_body.__globals__, tile=compiled_tile)
    body = types.FunctionType(product_body.__code__, scope, product_body.__name__)
    body.__qualname__, body.__module__ = product_body.__qualname__, product_body.__module__
    signature = (jit.array_type(dtype, 2, "C", readonly=True),
                 jit.array_type(dtype, 3, "C", readonly=True),
                 jit.array_type(dtype, 2, "C"), jit.array_type(dtype, 2, "C"))
    return body, signature


def _tile_intrinsic(rows: int) -> Any:
    """`tile` for `rows` rows as a Numba intrinsic: the loop over k in LLVM IR, the
    tile's rows x VECTORS accumulators in SIMD registers (phi nodes), one fused
    multiply-add (llvm.fma) per accumulator and k."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    def typer(typingctx, a, a_off, lda, b, b_off, ldb, c, c_off, ldc, k):
        sig = types.void(a, types.intp, types.intp, b, types.intp, types.intp, c,
                         types.intp, types.intp, types.intp)
        return sig, codegen

    def codegen(context, builder, signature, args):
        a, a_off, lda, b, b_off, ldb, c, c_off, ldc, k = args
        array_types = signature.args[0], signature.args[3], signature.args[6]
        pa, pb, pc = (builder.gep(context.make_array(ty)(context, builder, value).data, [off])
                      for ty, value, off in zip(array_types, (a, b, c), (a_off, b_off, c_off)))
        dtype = np.dtype(str(array_types[0].dtype))
        width, align = lanes(dtype), dtype.itemsize
        scalar = context.get_value_type(array_types[0].dtype)
        vec = ir.VectorType(scalar, width)
        vptr = vec.as_pointer()
        i64 = ir.IntType(64)
        name = f"llvm.fma.v{width}f{8 * align}"
        fma = builder.module.globals.get(name) or ir.Function(
            builder.module, ir.FunctionType(vec, [vec, vec, vec]), name)
        zero = ir.Constant(vec, None)
        splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), width), [0] * width)
        entry = builder.basic_block
        loop = builder.append_basic_block("tile_k")
        done = builder.append_basic_block("tile_store")
        builder.cbranch(builder.icmp_signed(">", k, ir.Constant(i64, 0)), loop, done)

        builder.position_at_end(loop)
        i = builder.phi(i64)
        i.add_incoming(ir.Constant(i64, 0), entry)
        acc = [builder.phi(vec) for _ in range(rows * VECTORS)]
        for phi in acc:
            phi.add_incoming(zero, entry)
        b_row = builder.gep(pb, [builder.mul(i, ldb)])
        bv = [builder.load(builder.bitcast(builder.gep(b_row, [ir.Constant(i64, v * width)]),
                                           vptr), align=align) for v in range(VECTORS)]
        summed = []
        for r in range(rows):
            x = builder.load(builder.gep(pa, [builder.add(builder.mul(ir.Constant(i64, r), lda),
                                                          i)]), align=align)
            splat = builder.shuffle_vector(
                builder.insert_element(ir.Constant(vec, ir.Undefined), x,
                                       ir.Constant(ir.IntType(32), 0)),
                ir.Constant(vec, ir.Undefined), splat_mask)
            summed += [builder.call(fma, [splat, bv[v], acc[r * VECTORS + v]])
                       for v in range(VECTORS)]
        following = builder.add(i, ir.Constant(i64, 1))
        i.add_incoming(following, loop)
        for phi, value in zip(acc, summed):
            phi.add_incoming(value, loop)
        builder.cbranch(builder.icmp_signed("<", following, k), loop, done)

        builder.position_at_end(done)
        results = []
        for value in summed:
            phi = builder.phi(vec)
            phi.add_incoming(zero, entry)
            phi.add_incoming(value, loop)
            results.append(phi)
        for index, value in enumerate(results):
            r, v = divmod(index, VECTORS)
            at = builder.add(builder.mul(ir.Constant(i64, r), ldc), ir.Constant(i64, v * width))
            builder.store(value, builder.bitcast(builder.gep(pc, [at]), vptr), align=align)
        return context.get_dummy_value()

    return intrinsic(typer)
