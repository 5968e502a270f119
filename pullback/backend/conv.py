"""Sliding-window ops on NumPy arrays for CpuBackend: im2col/col2im, conv2d (with
dilation and groups) and pooling with their backward passes. Validation lives here,
every entry point raising `KernelError` naming the op; the loops are Numba kernels
(pullback.kernels.conv), the products BLAS GEMMs.

A convolution runs over the batch in chunks small enough for their windows to stay
in cache: im2col of a chunk into one reused buffer, then batched GEMMs writing the
NCHW output (or the windows to fold back) in place, so no output is transposed and
no window buffer for the whole batch is ever written to memory.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from pullback.backend import blas, split, winograd
from pullback.errors import KernelError
from pullback.kernels import conv as kernels
from pullback.kernels import direct, products
from pullback.kernels import epilogue as epilogue_kernels

Pair = tuple[int, int]


class Windows(NamedTuple):
    """A validated window op: kernel, stride, padding and dilation pairs, output size."""

    kernel: Pair
    stride: Pair
    padding: Pair
    dilation: Pair
    out_hw: Pair

    def geometry(self, windows: np.ndarray | None = None) -> np.ndarray:
        """The kernels' geometry array for these windows laid out as `windows` (none for
        pooling), made once per layout (kernels only read it)."""
        key = (self, None if windows is None else (windows.itemsize, windows.strides[:4]))
        found = _GEOMETRIES.get(key)
        if found is None:
            found = _keep(_GEOMETRIES, key, kernels.geometry(
                self.kernel, self.stride, self.padding, self.dilation, self.out_hw, windows))
        return found


# Geometry arrays by windows and layout: a plan's convolutions ask for the same few at
# every step, and making one (an int64 array from a dozen Python ints) cost a few
# microseconds each time.
_GEOMETRIES: dict[tuple, np.ndarray] = {}
_MOST_KEPT = 256  # more signatures than a plan has: a cache this full starts over


def _keep(cache: dict, key: tuple, value: Any) -> Any:
    """value, kept in `cache` under key (the cache emptied first when full)."""
    if len(cache) >= _MOST_KEPT:
        cache.clear()
    cache[key] = value
    return value


# What a KernelError names: the operands of the op that failed.
Operands = list[Any] | tuple[Any, ...]


def pair(op: str, operands: Operands, name: str, value: Any, least: int) -> Pair:
    """value as an (int, int) pair, each at least `least`, or a KernelError for op."""
    try:
        first, second = (int(v) for v in value)
    except (TypeError, ValueError):
        raise KernelError(op, operands, f"{name} must be a pair of ints, not {value!r}") from None
    if first < least or second < least:
        bound = "positive" if least else "non-negative"
        raise KernelError(op, operands, f"{name} {(first, second)} must be {bound}")
    return first, second


def check_windows(
    op: str, x: np.ndarray, kernel: Any, stride: Any, padding: Any,
    operands: Operands | None = None, dilation: Any = (1, 1),
) -> Windows:
    """Validate a window op on x (N, C, H, W)."""
    operands = [x] if operands is None else operands
    if x.ndim != 4:
        raise KernelError(op, operands, f"expected a 4-D (N, C, H, W) input, got {x.ndim}-D")
    kernel = pair(op, operands, "kernel", kernel, 1)
    stride = pair(op, operands, "stride", stride, 1)
    padding = pair(op, operands, "padding", padding, 0)
    dilation = pair(op, operands, "dilation", dilation, 1)
    span = tuple(d * (k - 1) + 1 for k, d in zip(kernel, dilation))
    padded = (x.shape[2] + 2 * padding[0], x.shape[3] + 2 * padding[1])
    if span[0] > padded[0] or span[1] > padded[1]:
        what = f"kernel {kernel[0]}x{kernel[1]}"
        if dilation != (1, 1):
            what += f" dilated by {dilation} ({span[0]}x{span[1]})"
        raise KernelError(
            op, operands, f"{what} is larger than the padded input {padded[0]}x{padded[1]}"
        )
    out_hw = ((padded[0] - span[0]) // stride[0] + 1, (padded[1] - span[1]) // stride[1] + 1)
    return Windows(kernel, stride, padding, dilation, out_hw)


def check_float(op: str, operands: Operands) -> None:
    for array in operands:
        if array.dtype.kind != "f":
            raise KernelError(op, operands, "expected a floating dtype")
    kernels.check_dtype(op, list(operands))


def pad(x: np.ndarray, padding: Pair, value: float) -> np.ndarray:
    """x padded on its last two axes; x itself when there is no padding (internal use)."""
    ph, pw = padding
    if ph == 0 and pw == 0:
        return x
    h, w = x.shape[-2:]
    out = np.empty((*x.shape[:-2], h + 2 * ph, w + 2 * pw), dtype=x.dtype)
    # Fill only the border, then copy the interior once.
    out[..., :ph, :] = value
    out[..., ph + h:, :] = value
    out[..., ph:ph + h, :pw] = value
    out[..., ph:ph + h, pw + w:] = value
    out[..., ph:ph + h, pw:pw + w] = x
    return out


# ---------------------------------------------------------------- im2col and col2im


def unfold(x: np.ndarray, win: Windows, pad_value: Any = 0.0) -> np.ndarray:
    """Windows of x as (N, C, kh, kw, OH, OW), padding reading as pad_value."""
    out = np.empty((*x.shape[:2], *win.kernel, *win.out_hw), dtype=x.dtype)
    return kernels.unfold(x, out, win.geometry(out), pad_value)


def fold(cols: np.ndarray, input_shape: Sequence[int], win: Windows) -> np.ndarray:
    """The adjoint of unfold: windows (N, C, kh, kw, OH, OW) added into a zero
    (N, C, H, W) array, padding cropped."""
    cols = np.ascontiguousarray(cols)
    out = np.empty(tuple(input_shape), dtype=cols.dtype)
    return kernels.fold(cols, out, win.geometry(cols))


# ---------------------------------------------------------------- convolution


# Validated convolutions by signature (the op, the operands' shapes and dtypes, the
# geometry): a plan calls the same few convolutions at every step, and validating one
# from scratch (pairs, groups, dtypes, the window arithmetic) cost about as much Python
# time as a 2-sample convolution's whole forward. Only successes are kept: an invalid
# call is validated, and raises, every time.
_VALIDATED: dict[tuple, Windows] = {}


def _validated(key: tuple | None, check: Callable[[], Windows]) -> Windows:
    """check()'s Windows, computed once per `key`; a key that is None or has an
    unhashable part (a list for a pair) is checked every time."""
    if key is None:
        return check()
    try:
        found = _VALIDATED.get(key)
    except TypeError:
        return check()
    if found is None:
        found = _keep(_VALIDATED, key, check())
    return found


def _signature(op: str, shape: Any, array: Any, *geometry: Any) -> tuple | None:
    """The key `_validated` keeps a backward kernel's windows under: the op, the shape it
    is given, the other operand's shape and dtype, the geometry (groups with its type:
    True is refused where 1 is not); None (never kept) when one is not hashable."""
    if type(array) is not np.ndarray:
        return None
    try:
        return (op, tuple(shape), array.shape, array.dtype, *geometry, type(geometry[-1]))
    except TypeError:
        return None


def check_conv(
    x: np.ndarray, w: np.ndarray, stride: Any, padding: Any, dilation: Any = (1, 1),
    groups: Any = 1, op: str = "conv2d", operands: list | None = None,
) -> Windows:
    """The windows of a convolution of x by w, or a KernelError naming `op` (the
    forward or the backward kernel the caller called) and its `operands`."""
    if type(x) is np.ndarray and type(w) is np.ndarray:
        return _validated((op, x.shape, x.dtype, w.shape, w.dtype, stride, padding, dilation,
                           groups, type(groups)),
                          lambda: _check_conv(x, w, stride, padding, dilation, groups, op,
                                              operands))
    return _check_conv(x, w, stride, padding, dilation, groups, op, operands)


def _check_conv(x: np.ndarray, w: np.ndarray, stride: Any, padding: Any, dilation: Any,
                groups: Any, op: str, operands: list | None) -> Windows:
    operands = [x, w] if operands is None else operands
    if x.ndim != 4 or w.ndim != 4:
        raise KernelError(
            op, operands,
            "expected 4-D input (N, C, H, W) and weight (O, C / groups, kh, kw)",
        )
    for array in (x, w):
        if array.dtype.kind != "f":
            raise KernelError(op, operands, "expected a floating dtype")
    if x.dtype != w.dtype:
        raise KernelError(op, operands, "input and weight dtypes differ")
    check_float(op, [x, w])
    check_groups(op, operands, x.shape[1], w.shape, groups)
    return check_windows(op, x, w.shape[2:], stride, padding, operands, dilation)


def check_groups(op: str, operands: Operands, channels: int, weight_shape: Sequence[int],
                 groups: Any) -> int:
    """groups as an int dividing both channel counts, with weight (O, C/groups, kh, kw)."""
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise KernelError(op, operands, f"groups must be a positive int, not {groups!r}")
    groups = int(groups)
    out_channels, per_group = weight_shape[0], weight_shape[1]
    if channels % groups or out_channels % groups:
        raise KernelError(
            op, operands,
            f"groups {groups} must divide both the input channels {channels} and the "
            f"output channels {out_channels}",
        )
    if per_group * groups != channels:
        want = "" if groups == 1 else f" / groups {groups} = {channels // groups}"
        raise KernelError(
            op, operands,
            f"weight has {per_group} input channels but input has {channels}{want}",
        )
    return groups


# Convolutions run over the batch in chunks whose windows fit in about this many bytes,
# so each chunk's im2col is still in cache when its GEMM reads it (and col2im when its
# GEMM wrote it). One buffer for the whole batch (64x32x16x16, 3x3: 19 MB) ran the
# forward in 17.5 ms on one thread; chunks of 4 to 16 samples took 8.3 ms.
CHUNK_BYTES = 2 << 20


def _chunks(n: int, per_sample: int) -> list[tuple[int, int]]:
    size = max(1, min(n, CHUNK_BYTES // max(per_sample, 1)))
    return [(start, min(n, start + size)) for start in range(0, n, size)]


def _pointwise(win: Windows) -> bool:
    # A 1x1 kernel at stride 1 without padding: the windows are the input itself.
    return win.kernel == (1, 1) and win.stride == (1, 1) and win.padding == (0, 0)


_SCRATCH = threading.local()


def scratch(name: str, size: int, dtype: np.dtype) -> np.ndarray:
    """A flat work array of `size` elements that only the calling function reads (the
    windows of a chunk, a chunk's products), kept per thread and name and reused by
    the next call. Allocating them afresh cost page faults on every call: multi-megabyte
    blocks go back to the kernel when freed (conv 32->64 on 4x4 maps, batch 128:
    forward 2.3 ms, of which 1.05 is im2col and GEMM)."""
    if name in _KEPT_IN:
        _SCRATCH.kept = None  # the forward's windows are about to be overwritten
    pool = getattr(_SCRATCH, "arrays", None)
    if pool is None:
        pool = _SCRATCH.arrays = {}
    key = (name, np.dtype(dtype))
    found = pool.get(key)
    if found is None or found.size < size:
        found = pool[key] = np.empty(size, dtype)
    return found[:size]


class _WindowBuffer:
    """A reusable buffer of windows (m, C, kh, kw, OH, OW) for chunks of up to `rows`
    samples, and the geometry that addresses it."""

    def __init__(self, win: Windows, channels: int, rows: int, dtype: np.dtype):
        self.shape = (channels, *win.kernel, *win.out_hw)
        self.size = int(np.prod(self.shape))
        self.flat = scratch("windows", rows * self.size, dtype)
        self.geometry = win.geometry(self.take(1))

    def take(self, m: int) -> np.ndarray:
        """The first m samples' windows, C-contiguous."""
        return self.flat[:m * self.size].reshape(m, *self.shape)


def _result(op: str, operands: list, shape: tuple, dtype: np.dtype,
            out: np.ndarray | None) -> np.ndarray:
    """A fresh result array, or `out` (a plan's buffer) once it is checked to fit."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise KernelError(op, [*operands, out], f"out= must be a C-contiguous {dtype} array "
                                                f"of shape {shape}")
    return out


# What a convolution applies to each chunk of its output right after computing it:
# `epilogue(rows, start, stop, threads=0)`, rows the chunk's samples start:stop as
# (m, O, OH OW); with `threads`, it may run on as many of Numba's threads (the
# convolution's own products ran there: `_own_threads`).
Epilogue = Callable[..., None]


class ChannelEpilogue:
    """FusedOps.conv2d_epilogue's epilogue (pullback.kernels.epilogue): per output channel
    a bias, a scale and a shift (O,), then a residual (N, O, OH OW), then relu, each but
    relu optional. Called on a chunk's rows, or handed to the products on pullback's
    threads, which apply it as they store (`products_epilogue`); `covered` lists the
    samples it ran on, chunk by chunk, either way."""

    def __init__(self, bias: np.ndarray | None, scale: np.ndarray | None,
                 shift: np.ndarray | None, residual: np.ndarray | None, relu: bool):
        self.bias, self.scale, self.shift = bias, scale, shift
        self.residual, self.relu = residual, relu
        self.covered: list[int] = []  # appended to, one atomic step: parts run on threads

    def __call__(self, rows: np.ndarray, start: int, stop: int, threads: int = 0) -> None:
        epilogue_kernels.apply(rows, self.bias, self.scale, self.shift,
                               None if self.residual is None else self.residual[start:stop],
                               self.relu, threads)
        self.covered.append(stop - start)

    def products_epilogue(self, sample: int, groups: int) -> products.Epilogue:
        """The epilogue of sample `sample`'s output (groups, O / groups, OH OW), for the
        products that compute it (noted as run on it)."""
        residual = None if self.residual is None else \
            self.residual[sample].reshape(groups, -1, self.residual.shape[-1])
        self.covered.append(1)
        return products.Epilogue(self.bias, self.scale, self.shift, residual, self.relu)

# Winograd F(4x4, 3x3) (pullback.backend.winograd) for 3x3, stride-1 convolutions where
# it measured faster than im2col (`python bench/winograd.py`; figures in
# bench/RESULTS.md): at least 16 channels on each side, maps of at least 8x8 and 32
# tiles of 4x4 outputs in the batch. It took 0.4-0.9x im2col's time on the 3x32x32
# CNN's second convolution, all three of ResNet-20's stages (CPU time on one thread;
# on two threads under load 0.15-0.65x, im2col's many small threaded GEMMs stalling)
# and ResNet-50's 64@56x56 and 128@28x28 at batch 1. Two threads on a quiet machine
# once measured 16 channels at 32x32 and 64 at 8x8 as fast as im2col, no slower. It
# lost with 3 input channels (1.9x), on 4x4 maps (1.4x; the small-map path is faster
# there) and on ResNet-50's 256@14x14 and 512@7x7 at batch 1 (1.7-5x: narrow GEMMs,
# large weight transforms; those have under 32 tiles).
WINOGRAD_CHANNELS = 16
WINOGRAD_SIDE = 8
WINOGRAD_TILES = 32
WINOGRAD_FORCED: bool | None = None  # True or False: always or never (benchmarks, tests)


def _winograd(win: Windows, groups: int, batch: int, c_in: int, c_out: int,
              kept: bool = False) -> bool:
    """Whether a correlation of c_in channels into c_out, with these windows (the
    forward's), runs as Winograd F(4x4, 3x3): the forward (c_in = C, c_out = O), or its
    input gradient (c_in = O, c_out = C). `kept`: the kernels' transform is kept from
    call to call (`_transformed`), so a count of tiles too small to pay for transforming
    them at every call is no bar."""
    if (win.kernel != (3, 3) or win.stride != (1, 1) or win.dilation != (1, 1)
            or groups != 1):
        return False
    if WINOGRAD_FORCED is not None:
        return WINOGRAD_FORCED
    batch = getattr(_PART, "batch", None) or batch  # a part of a split batch: the whole
    grid = winograd.tiles(win.out_hw)
    return (min(c_in, c_out) >= WINOGRAD_CHANNELS and min(win.out_hw) >= WINOGRAD_SIDE
            and (kept or batch * grid[0] * grid[1] >= WINOGRAD_TILES))


# Winograd's transformed kernels of constant weights (`conv2d(constant_weights=True)`),
# by id() of the weights, each with a weak reference that drops the entry with them: a
# plan passes the same array at every call. Transforming 256 x 256 kernels took 0.65 ms
# at every call, more than the 14x14 convolution at batch 1 saved through Winograd.
_TRANSFORMS: dict[int, tuple[weakref.ref, np.ndarray]] = {}


def _transformed(w: np.ndarray, kept: bool) -> np.ndarray:
    """Winograd's transform of the 3x3 kernels w, kept for the next call when `kept`."""
    if not kept:
        return winograd.weight_transform(w)
    key = id(w)
    found = _TRANSFORMS.get(key)
    if found is not None and found[0]() is w:
        return found[1]
    u = winograd.weight_transform(w)

    def forget(_: weakref.ref) -> None:
        _TRANSFORMS.pop(key, None)

    _TRANSFORMS[key] = (weakref.ref(w, forget), u)
    return u


# A convolution of at least this many multiply-adds is split over BLAS's threads by
# batch (pullback.backend.split), BLAS on one thread meanwhile: pullback's own passes
# (im2col, col2im, Winograd's tile transforms) then use every core. Smaller ones (the
# digits CNNs, 2-9M) measured 1.5x slower split: a part is too short for a thread to
# pay (bench/RESULTS.md). Once work has split in this process (`blas.splitting`), a
# smaller one runs whole with its products on one BLAS thread, as other products do
# (pullback.backend.blas). At 2**26, the 3x32x32 CNN's 56M first layer ran threaded by
# BLAS, its workers then spinning on the core its 302M second layer's parts needed:
# that layer took 4.8-5.5 ms a pass in the training step, against 2.3-2.5 alone.
SPLIT_MACS = 1 << 25
_PART = threading.local()  # .batch: the whole batch, on a thread running a part of it


def _macs(win: Windows, n: int, c: int, o: int, groups: int) -> int:
    """A convolution's multiply-adds: the same for the forward and both gradients."""
    return n * o * win.out_hw[0] * win.out_hw[1] * (c // groups) * win.kernel[0] * win.kernel[1]


def _by_parts(win: Windows, n: int, c: int, o: int, groups: int) -> bool:
    """Whether a convolution of c channels into o over a batch of n runs through
    `_over_batch`: a batch of more than one sample, unless this thread already runs a
    part of one, that splits or (once work has split in this process) whose products
    run on one BLAS thread. Any other runs as it is, BLAS threading its products (a
    batch of one always), which this notes (`blas.threading_products`)."""
    if getattr(_PART, "batch", None) is not None:
        return False
    if n >= 2 and (_macs(win, n, c, o, groups) >= SPLIT_MACS or blas.splitting()):
        return True
    blas.threading_products()
    return False


def _over_batch(win: Windows, n: int, c: int, o: int, groups: int,
                run: Callable[[int, int], Any]) -> list:
    """[run(start, stop) per part]: a convolution of c channels into o over a batch of n,
    each part run as a convolution of its own, not split again, and taking the path the
    whole batch would (`_winograd` counts the whole batch's tiles).

    From SPLIT_MACS multiply-adds the parts run at once (split.over_parts). Below, the
    whole batch is one part, run here with BLAS on one thread: `_by_parts` sends one
    here once work has split in this process. A product BLAS
    threads leaves its workers spinning for a while after it returns (OpenBLAS: about
    0.1 s), each on a core the next split convolution's parts need: on two cores,
    ResNet-20's training step took 250 ms against 182 with its 1x1 and first-layer
    convolutions threaded by BLAS (one process, in turns). Where nothing splits (the
    digits CNNs), BLAS's threads pay: their steps took 9-12% longer without them."""

    def part(a: int, b: int) -> Any:
        _PART.batch = n
        try:
            return run(a, b)
        finally:
            _PART.batch = None

    if _macs(win, n, c, o, groups) >= SPLIT_MACS:
        return split.over_parts(n, part)
    with blas.one_thread():
        return [part(0, n)]


def conv2d(x: np.ndarray, w: np.ndarray, stride: Any, padding: Any, dilation: Any = (1, 1),
           groups: int = 1, out: np.ndarray | None = None,
           epilogue: Epilogue | None = None, constant_weights: bool = False) -> np.ndarray:
    """x (N, C, H, W) cross-correlated with w (O, C/groups, kh, kw): per chunk of the
    batch, im2col then one batched GEMM per sample and group, written in place (into
    `out` when given); `epilogue` then runs on each chunk of the output while it is in
    cache. A batch of one's first layer (products.windows_pay) multiplies its windows
    block by block as it makes them instead. `constant_weights`: w is the same array
    holding the same values at every call (FusedOps.conv2d_epilogue), so Winograd's
    transform of it is kept (`_transformed`)."""
    win = check_conv(x, w, stride, padding, dilation, groups)
    n, c = x.shape[:2]
    o = w.shape[0]
    pixels = win.out_hw[0] * win.out_hw[1]
    weight = w.reshape(groups, o // groups, -1)
    out = _result("conv2d", [x, w], (n, o, *win.out_hw), x.dtype, out)
    if out.size == 0 or x.size == 0 or w.size == 0:
        out[...] = 0  # an empty batch (or no channels): a sum over nothing, as PyTorch
        if epilogue is not None:
            epilogue(out.reshape(n, o, pixels), 0, n)
        return out
    if _direct(win, groups, c, o):
        x, w = np.ascontiguousarray(x), np.ascontiguousarray(w)
        geo = _direct_geometry(win)

        def forward(a: int, b: int) -> None:
            direct.forward(x[a:b], w, out[a:b], geo)
            if epilogue is not None:
                epilogue(out[a:b].reshape(b - a, o, pixels), a, b)

        _direct_parts(win, n, c, o, forward)
        return out
    threads = _own_threads(n, x.dtype)
    with _crew(threads):
        if not threads and _by_parts(win, n, c, o, groups):
            def part(a: int, b: int) -> None:
                shifted = None if epilogue is None else (
                    lambda rows, start, stop, threads=0: epilogue(rows, start + a, stop + a,
                                                                  threads))
                conv2d(x[a:b], w, stride, padding, dilation, groups, out[a:b], shifted,
                       constant_weights)

            _over_batch(win, n, c, o, groups, part)
            return out
        rows = out.reshape(n, groups, o // groups, pixels)
        x = np.ascontiguousarray(x)
        if _pointwise(win):
            if not _multiply(weight, x.reshape(n, groups, -1, pixels), rows, threads, epilogue) \
                    and epilogue is not None:
                epilogue(out.reshape(n, o, pixels), 0, n, threads)
            return out
        if _winograd(win, groups, n, c, o, constant_weights):
            return winograd.correlate(x, _transformed(w, constant_weights), win.padding, out,
                                      scratch, epilogue, lambda a, b, into: _multiply(
                                          a, b, into, threads), threads)
        if threads and groups == 1 and out.flags.c_contiguous and products.windows_pay(
                o, weight.shape[2], pixels, x.dtype):
            fused = epilogue.products_epilogue(0, 1) \
                if isinstance(epilogue, ChannelEpilogue) else None
            products.windows_matmul(x, np.ascontiguousarray(weight[0]), out.reshape(o, pixels),
                                    _window_geometry(win, c, x.dtype), threads, fused)
            if fused is None and epilogue is not None:
                epilogue(out.reshape(n, o, pixels), 0, n, threads)
            return out
        per_sample = c * win.kernel[0] * win.kernel[1] * pixels
        chunks = _chunks(n, per_sample * x.itemsize)
        if _small_maps(win, chunks, c, o):
            _conv_batch_inner(x, weight, win, out, chunks, epilogue)
            return out
        if pixels < CHUNK_GEMM_PIXELS and chunks[0][1] > 1:
            _conv_by_chunk_gemm(x, weight, win, rows, chunks, epilogue)
            return out
        buffer = _WindowBuffer(win, c, chunks[0][1], x.dtype)
        for start, stop in chunks:
            cols = buffer.take(stop - start)
            kernels.unfold(x[start:stop], cols, buffer.geometry, 0.0, threads)
            if not _multiply(weight, cols.reshape(stop - start, groups, -1, pixels),
                             rows[start:stop], threads, epilogue, start) and epilogue is not None:
                epilogue(out[start:stop].reshape(stop - start, o, pixels), start, stop, threads)
        return out


# A convolution's forward over a batch of one runs its products on pullback's threads
# (pullback.kernels.products) rather than BLAS's: it cannot split by sample, and BLAS's
# threads, spinning between its products, slowed the passes between them, which now
# run on the same threads (im2col, Winograd's transforms, the epilogue). ResNet-50's
# inference took 1.25-1.35x onnxruntime's time so, against 1.44-1.72x (bench/RESULTS.md).
# OWN_THREADS_FORCED (None, True or False) overrides the rule: tests, benchmarks.
OWN_THREADS_FORCED: bool | None = None
# One convolution at a time on the crew: Numba's workqueue threading layer (where
# neither OpenMP nor TBB is installed) aborts the process on parallel loops started
# from two threads at once.
_CREW = threading.Lock()
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _own_threads(n: int, dtype: np.dtype) -> int:
    """The threads a convolution's forward over a batch of n runs its products on
    (pullback.kernels.products), or 0: BLAS's (NumPy's matmul). A batch of one in
    float32 or float64, outside a part of a split batch, where Numba's crew has more
    than one thread (OWN_THREADS_FORCED decides that last condition where set)."""
    if n != 1 or dtype not in _FLOATS or getattr(_PART, "batch", None) is not None:
        return 0
    threads = min(products.threads(), blas.threads())  # as many as BLAS would take
    wanted = threads > 1 if OWN_THREADS_FORCED is None else OWN_THREADS_FORCED
    if not wanted:
        return 0
    products.starting()  # the transforms' and epilogue's parallel loops too
    blas.note_split()  # small products elsewhere then keep BLAS's threads asleep
    return max(1, threads)


def _multiply(a: np.ndarray, b: np.ndarray, out: np.ndarray, threads: int,
              epilogue: Epilogue | None = None, sample: int = 0) -> bool:
    """out = a @ b, a (g, M, K) broadcast over b's leading axes (..., g, K, P) into out
    (..., g, M, P): NumPy's matmul on BLAS's threads, or with `threads`, one stack of
    products on pullback's (b's and out's leading axes, of one sample, dropped), which
    apply a ChannelEpilogue of the convolution's sample `sample` as they store it.
    Whether the epilogue ran so."""
    if not threads:
        np.matmul(a, b, out=out)
        return False
    if a.strides[-1] != a.itemsize:  # weights sliced along their last axis
        a = np.ascontiguousarray(a)
    fused = epilogue.products_epilogue(sample, a.shape[0]) \
        if isinstance(epilogue, ChannelEpilogue) else None
    products.matmul(a, b.reshape(b.shape[-3:]), out.reshape(out.shape[-3:]), threads, fused)
    return fused is not None


@functools.lru_cache(maxsize=256)
def _window_geometry(win: Windows, channels: int, dtype: np.dtype) -> np.ndarray:
    """The geometry of one sample's C-contiguous window array (1, C, kh, kw, OH, OW),
    read from a stand-in with no memory of its own (geometry reads strides only)."""
    shape = (1, channels, *win.kernel, *win.out_hw)
    strides = dtype.itemsize * np.cumprod((1, *shape[:0:-1]))[::-1]
    return win.geometry(np.lib.stride_tricks.as_strided(np.empty(1, dtype), shape,
                                                        tuple(int(v) for v in strides)))


def _crew(threads: int) -> contextlib.AbstractContextManager:
    """Held while a batch of one's passes run on the crew (`threads`), else nothing."""
    return _CREW if threads else contextlib.nullcontext()


# Below this many output pixels per sample, a GEMM per sample is too narrow to run
# near BLAS's peak: the forward takes one GEMM per chunk of samples instead (64x32x16x16
# into 64 channels: 5.8 -> 4.8 ms; at 32x32 pixels the two ways measured alike).
CHUNK_GEMM_PIXELS = 1024


def _windows_channels_outer(x: np.ndarray, win: Windows, windows: np.ndarray) -> np.ndarray:
    """im2col of the samples x (m, C, H, W) into the front of the flat buffer `windows`,
    channels outer, (C, kh, kw, m, OH, OW): per group, one (C/g kh kw, m OH OW) matrix."""
    m, c = x.shape[:2]
    cols = windows[:c * win.kernel[0] * win.kernel[1] * m * win.out_hw[0] * win.out_hw[1]]
    cols = cols.reshape(c, *win.kernel, m, *win.out_hw)
    kernels.unfold(x, cols, win.geometry(cols.transpose(3, 0, 1, 2, 4, 5)), 0.0)
    return cols


def _conv_by_chunk_gemm(x: np.ndarray, weight: np.ndarray, win: Windows, rows: np.ndarray,
                        chunks: list, epilogue: Epilogue | None) -> None:
    """The forward as one GEMM per chunk and group, weight (O/g, C/g kh kw) times the
    chunk's windows (C/g kh kw, m OH OW), the product moved into the NCHW result `rows`
    (N, g, O/g, OH OW) while still in cache."""
    groups, per_group = weight.shape[:2]
    pixels = win.out_hw[0] * win.out_hw[1]
    most = chunks[0][1]
    windows = scratch("windows", most * x.shape[1] * win.kernel[0] * win.kernel[1] * pixels,
                      x.dtype)
    products = scratch("products", most * groups * per_group * pixels, x.dtype)
    for start, stop in chunks:
        m = stop - start
        cols = _windows_channels_outer(x[start:stop], win, windows)
        product = products[:m * groups * per_group * pixels].reshape(groups, per_group, m * pixels)
        np.matmul(weight, cols.reshape(groups, -1, m * pixels), out=product)
        np.copyto(rows[start:stop], product.reshape(groups, per_group, m, pixels)
                  .transpose(2, 0, 1, 3))
        if epilogue is not None:
            epilogue(rows[start:stop].reshape(m, groups * per_group, pixels), start, stop)


def conv2d_input_backward(
    upstream: np.ndarray, w: np.ndarray, input_shape: Sequence[int], stride: Any,
    padding: Any, dilation: Any = (1, 1), groups: int = 1, out: np.ndarray | None = None,
) -> np.ndarray:
    """Gradient wrt x (into `out` when given): at stride 1, where it copies less, conv2d
    of the upstream by the rotated weights (`_input_gradient_as_forward`); otherwise
    w^T @ upstream per sample and group, as windows folded back (col2im), chunk by
    chunk."""
    op = "conv2d_input_backward"
    win = _validated(
        _signature(op, input_shape, w, stride, padding, dilation, groups),
        lambda: _check_conv(_probe(op, input_shape, w.dtype, [upstream, w]), w, stride,
                            padding, dilation, groups, op, [upstream, w]))
    _check_upstream("conv2d_input_backward", upstream, (input_shape[0], w.shape[0]), win, w)
    n, c = input_shape[:2]
    o = w.shape[0]
    pixels = win.out_hw[0] * win.out_hw[1]
    weight_t = w.reshape(groups, o // groups, -1).transpose(0, 2, 1)
    up = np.ascontiguousarray(upstream).reshape(n, groups, o // groups, pixels)
    grad = _result("conv2d_input_backward", [upstream, w], tuple(input_shape), w.dtype, out)
    if grad.size == 0 or upstream.size == 0 or w.size == 0:
        grad[...] = 0  # an empty batch, or nothing reaches the input
        return grad
    if _direct(win, groups, c, o):
        w, geo = np.ascontiguousarray(w), _direct_geometry(win)
        up4 = up.reshape(n, o, *win.out_hw)
        _direct_parts(win, n, c, o, lambda a, b: direct.input_backward(up4[a:b], w, grad[a:b],
                                                                        geo))
        return grad
    if _by_parts(win, n, c, o, groups):
        _over_batch(win, n, c, o, groups, lambda a, b: conv2d_input_backward(
            upstream[a:b], w, (b - a, *input_shape[1:]), stride, padding, dilation, groups,
            grad[a:b]))
        return grad
    if _pointwise(win):
        np.matmul(weight_t, up, out=grad.reshape(n, groups, -1, pixels))
        return grad
    if _input_gradient_as_forward(win, groups, n, c, o):
        # The same kind of correlation as the forward: upstream by the rotated kernels,
        # channels swapped, padded by the kernel's span - 1 - padding; conv2d picks
        # its own path for it (Winograd, small maps, im2col).
        return conv2d(upstream, _rotated(w, groups), (1, 1), _full_padding(win),
                      win.dilation, groups, out=grad)
    per_sample = c * win.kernel[0] * win.kernel[1] * pixels
    chunks = _chunks(n, per_sample * w.itemsize)
    if _small_maps(win, chunks, c, o):
        _input_backward_batch_inner(upstream, weight_t, win, grad, chunks)
        return grad
    buffer = _WindowBuffer(win, c, chunks[0][1], w.dtype)
    for start, stop in chunks:
        cols = buffer.take(stop - start)
        np.matmul(weight_t, up[start:stop], out=cols.reshape(stop - start, groups, -1, pixels))
        kernels.fold(cols, grad[start:stop], buffer.geometry)
    return grad


def _input_gradient_as_forward(win: Windows, groups: int, batch: int, c: int, o: int) -> bool:
    """Whether the input gradient of a convolution of c channels into o with these
    windows runs as conv2d of the upstream (`_rotated` weights, `_full_padding`): at
    stride 1, where every padding is at most the kernel's span less one (no input
    column is cropped), and where that correlation takes Winograd or has no more
    windows to copy than the GEMM + col2im way has to fold (o <= c): its im2col copies
    o kh kw values per pixel into a GEMM by the weights (C, O kh kw), where the other
    way writes c kh kw values per pixel and adds them back (col2im). A first layer
    (3 -> 16 channels at 32x32) measured 2.3x slower this way."""
    if win.stride != (1, 1) or win.kernel == (1, 1) or any(
            p > d * (k - 1) for p, d, k in zip(win.padding, win.dilation, win.kernel)):
        return False
    return o <= c or _winograd(win, groups, batch, o, c)


def _rotated(w: np.ndarray, groups: int) -> np.ndarray:
    """The weights (C, O/g, kh, kw) of the correlation that is the input gradient of
    w (O, C/g, kh, kw): per group, output and input channels swapped, each kernel
    turned by 180 degrees."""
    o, per_group, kh, kw = w.shape
    swapped = w.reshape(groups, o // groups, per_group, kh, kw).transpose(0, 2, 1, 3, 4)
    return swapped.reshape(groups * per_group, o // groups, kh, kw)[:, :, ::-1, ::-1]


def _full_padding(win: Windows) -> Pair:
    """The padding of the input gradient's correlation: span - 1 - padding per axis."""
    return (win.dilation[0] * (win.kernel[0] - 1) - win.padding[0],
            win.dilation[1] * (win.kernel[1] - 1) - win.padding[1])


def conv2d_weight_backward(
    upstream: np.ndarray, x: np.ndarray, weight_shape: Sequence[int], stride: Any,
    padding: Any, dilation: Any = (1, 1), groups: int = 1,
) -> np.ndarray:
    """Gradient wrt w: through Winograd where the forward takes it (`_winograd`);
    otherwise upstream @ windows^T per group, summed over the batch chunk by chunk,
    im2col recomputed per chunk while in cache (cheaper than keeping the forward's: it
    would be the whole batch's windows, written to memory and kept), but on small maps
    the windows a whole-batch forward left in scratch are taken when they are still
    there and x is bit for bit that forward's input (`_kept_windows`)."""
    op = "conv2d_weight_backward"
    win = _validated(
        _signature(op, weight_shape, x, stride, padding, dilation, groups),
        lambda: _check_conv(x, _probe(op, weight_shape, x.dtype, [upstream, x]), stride,
                            padding, dilation, groups, op, [upstream, x]))
    _check_upstream("conv2d_weight_backward", upstream, (x.shape[0], weight_shape[0]), win, x)
    if upstream.size == 0 or x.size == 0:
        return np.zeros(tuple(weight_shape), x.dtype)  # an empty batch adds nothing
    n, c = x.shape[:2]
    o = weight_shape[0]
    if _direct(win, groups, c, o):
        x, up4, geo = np.ascontiguousarray(x), np.ascontiguousarray(upstream), \
            _direct_geometry(win)
        return _summed(_direct_parts(win, n, c, o, lambda a, b: direct.weight_backward(
            up4[a:b], x[a:b], tuple(weight_shape), geo)))
    if _by_parts(win, n, c, o, groups):
        return _summed(_over_batch(win, n, c, o, groups, lambda a, b: conv2d_weight_backward(
            upstream[a:b], x[a:b], weight_shape, stride, padding, dilation, groups)))
    if _winograd(win, groups, n, c, o):
        return winograd.weight_gradient(x, upstream, win.padding, scratch)
    pixels = win.out_hw[0] * win.out_hw[1]
    up = np.ascontiguousarray(upstream).reshape(n, groups, o // groups, pixels)
    x = np.ascontiguousarray(x)
    rows = c // groups * win.kernel[0] * win.kernel[1]  # im2col rows per group
    per_sample = c * win.kernel[0] * win.kernel[1] * pixels
    chunks = _chunks(n, per_sample * x.itemsize)
    if _small_maps(win, chunks, c, o) and not _pointwise(win):
        return _weight_backward_batch_inner(upstream, x, weight_shape, win, groups, chunks)
    if rows > pixels:
        return _weight_backward_by_chunk_gemm(up, x, weight_shape, win, groups, chunks)
    # Few rows (as a first layer's 3 kh kw): per-sample GEMMs, each summing a long row.
    grad = np.zeros((groups, o // groups, rows), dtype=x.dtype)
    buffer = None if _pointwise(win) else _WindowBuffer(win, c, chunks[0][1], x.dtype)
    for start, stop in chunks:
        if buffer is None:
            cols = x[start:stop]
        else:
            cols = buffer.take(stop - start)
            kernels.unfold(x[start:stop], cols, buffer.geometry, 0.0)
        cols = cols.reshape(stop - start, groups, -1, pixels)
        grad += np.matmul(up[start:stop], cols.transpose(0, 1, 3, 2)).sum(0)
    return grad.reshape(tuple(weight_shape))


def _summed(grads: list[np.ndarray]) -> np.ndarray:
    """The weight gradients of a batch's parts summed in the parts' order, whichever
    thread ran them (a part's result may be a view of its thread's scratch: copied)."""
    if len(grads) == 1:
        return grads[0]
    grad = grads[0].copy()
    for more in grads[1:]:
        grad += more
    return grad


def _weight_backward_by_chunk_gemm(up: np.ndarray, x: np.ndarray, weight_shape: Sequence[int],
                                   win: Windows, groups: int, chunks: list) -> np.ndarray:
    """The weight gradient as one GEMM per chunk and group, windows (C/g kh kw, m OH OW)
    times the chunk's upstream transposed: with more im2col rows than pixels per sample
    (a 3x3 conv of 32 channels at 16x16), per-sample GEMMs each wrote a full weight-sized
    product to sum; this measured 17% less CPU time (8.0 against 9.6 ms on one thread)."""
    c = x.shape[1]
    o = weight_shape[0]
    pixels = win.out_hw[0] * win.out_hw[1]
    size = c * win.kernel[0] * win.kernel[1] * pixels
    most = chunks[0][1]
    windows = scratch("windows", most * size, x.dtype)
    rows = scratch("products", most * o * pixels, x.dtype)
    grad_t = np.zeros((groups, size // pixels // groups, o // groups), dtype=x.dtype)
    for start, stop in chunks:
        m = stop - start
        cols = _windows_channels_outer(x[start:stop], win, windows)
        ups = rows[:m * o * pixels].reshape(groups, o // groups, m, pixels)
        np.copyto(ups, up[start:stop].transpose(1, 2, 0, 3))
        grad_t += np.matmul(cols.reshape(groups, -1, m * pixels),
                            ups.reshape(groups, o // groups, m * pixels).transpose(0, 2, 1))
    return np.ascontiguousarray(grad_t.transpose(0, 2, 1)).reshape(tuple(weight_shape))


# ---------------------------------------------------------------- small maps
# On small maps (a digits CNN's 8x8 down to 2x2) im2col's rows are as short as the map
# (4 floats at 4x4), so a kernel copied 73,000 of them for one batch of 128 and spent
# more time per row than per float. With the batch innermost, a sample's windows sit
# beside the other samples': x as (C, H, W, N) is one image (C, H, W N) whose windows,
# at stride (sh, 1) with the column padding and dilation scaled by N, are the columns
# (C kh kw, OH OW N) of the whole chunk, copied in rows OW N long; the GEMM's rows are
# the batch times the map. The same geometry folds the input gradient back. Two tiled
# transposes move the batch innermost and back. Measured on one thread, CPU time, old
# way against this one (forward, input gradient, weight gradient, ms): conv 16->32 on
# 6x6, batch 128: 1.39 0.92 1.72 against 0.87 0.61 0.68; 32->64 on 4x4 (pad 1), batch
# 32: 0.96 0.74 0.76 against 0.51 0.61 0.72; 16->32 on 10x10, batch 64: 3.96 3.16 4.24
# against 1.75 1.77 2.36; 12x12 still gained a little, 16x16 maps did not. The
# transposes move the output (O values per pixel) while the gain is on the windows
# (C kh kw per pixel), so a first layer (1 -> 32 channels, 8x8, batch 32) stays on the
# old path: this way its gradients took 0.3 ms against 0.18.
SMALL_MAP_PIXELS = 144


# Convolutions with few window values per pixel (C kh kw <= DIRECT_WINDOW: a first layer
# on 1-3 channels) on small maps run a sample at a time in register tiles
# (pullback.kernels.direct). In training steps, each path taking turns step by step:
# the digits CNN's 1 -> 16 layer (8x8, batch 128) took 90 us forward and 93 us for its
# weight gradient against 158 and 137 on the small-map path; `pullback train`'s 1 -> 32
# (8x8, padding 1, batch 32) 91 and 114 against 144 and 130. With 144 and 288 window
# values (16 -> 32 at 6x6, 32 -> 64 at 4x4) one thread of this took as long as the
# small-map path's GEMMs on two, or up to 1.6x longer. Split in two parts (even with the
# worker's part posted without the GIL, so that it started within 10 us) the half on the
# thread that had not made the inputs ran 1.5x slower than the other, fetching them from
# the other core's cache; the digits CNN's step gained 5-10% so, but a process's BLAS
# then ran on one thread for everything else (blas.note_split): `pullback train`'s CNN,
# run after it in the same process, lost as much (bench/RESULTS.md).
DIRECT_WINDOW = 64
DIRECT_FORCED: bool | None = None  # True or False: always or never where it can (tests)


def _direct(win: Windows, groups: int, c: int, o: int) -> bool:
    """Whether a convolution of c channels into o runs a sample at a time in register
    tiles (pullback.kernels.direct): small maps, stride 1, no dilation, one group, not
    pointwise and not a shape Winograd may take (whatever its batch); with few window
    values per pixel, unless DIRECT_FORCED says otherwise."""
    if (win.out_hw[0] * win.out_hw[1] > SMALL_MAP_PIXELS or groups != 1 or win.stride != (1, 1)
            or win.dilation != (1, 1) or _pointwise(win)
            or _winograd(win, groups, 1, c, o, kept=True)):
        return False
    if DIRECT_FORCED is not None:
        return DIRECT_FORCED
    return c * win.kernel[0] * win.kernel[1] <= DIRECT_WINDOW


def _direct_geometry(win: Windows) -> np.ndarray:
    """pullback.kernels.direct's geometry array for these windows, made once."""
    key = ("direct", win)
    found = _GEOMETRIES.get(key)
    if found is None:
        found = _keep(_GEOMETRIES, key, direct.geometry(win.kernel, win.padding, win.out_hw))
    return found


def _direct_parts(win: Windows, n: int, c: int, o: int, run: Callable[[int, int], Any]
                  ) -> list:
    """[run(start, stop) per part] of a direct convolution's batch: one part per BLAS
    thread from SPLIT_MACS multiply-adds (split.over_parts), the whole batch below."""
    if n >= 2 and _macs(win, n, c, o, 1) >= SPLIT_MACS:
        return split.over_parts(n, run)
    return [run(0, n)]


def _small_maps(win: Windows, chunks: list, channels: int, out_channels: int) -> bool:
    """Whether the batch-innermost path runs: small maps, unit column stride (the
    scaled geometry needs it), more than one sample per chunk, and at least as many
    window values as outputs per pixel."""
    return (win.out_hw[0] * win.out_hw[1] <= SMALL_MAP_PIXELS and win.stride[1] == 1
            and chunks[0][1] > 1 and channels * win.kernel[0] * win.kernel[1] >= out_channels)


def _batch_inner_geometry(win: Windows, m: int, cols: np.ndarray) -> np.ndarray:
    """The geometry of the windows (1, C, kh, kw, OH, OW m) of a chunk of m samples
    laid out as one (1, C, H, W m) image, batch innermost."""
    key = (win, m, cols.itemsize, cols.strides[:4])
    found = _GEOMETRIES.get(key)
    if found is None:
        found = _keep(_GEOMETRIES, key, kernels.geometry(
            win.kernel, win.stride, (win.padding[0], win.padding[1] * m),
            (win.dilation[0], win.dilation[1] * m), (win.out_hw[0], win.out_hw[1] * m), cols))
    return found


def _batch_inner_windows(x: np.ndarray, win: Windows, keep: bool = False) -> np.ndarray:
    """The windows of the samples x (m, C, H, W) as (C kh kw, OH OW m), in scratch;
    with `keep`, left there for the weight gradient (`_kept_windows`)."""
    m, c, h, w = x.shape
    inner = scratch("samples", x.size, x.dtype).reshape(c * h * w, m)
    kernels.transpose(x.reshape(m, -1), inner)
    kh, kw = win.kernel
    oh, ow = win.out_hw
    cols = scratch("windows", c * kh * kw * oh * ow * m, x.dtype).reshape(1, c, kh, kw, oh,
                                                                          ow * m)
    kernels.unfold(inner.reshape(1, c, h, w * m), cols, _batch_inner_geometry(win, m, cols),
                   0.0)
    cols = cols.reshape(c * kh * kw, oh * ow * m)
    if keep:
        _SCRATCH.kept = (win, x.shape, x.dtype, inner, cols)
    return cols


# A training step computes a small-map convolution's windows twice: in the forward, and
# for the weight gradient, from the same input (saved for backward). The forward of a
# whole batch (one chunk) leaves its windows, and its samples transposed, in scratch;
# they stay valid until another call takes that scratch ("samples" or "windows"), and
# the weight gradient takes the windows instead of computing them again when its input
# is bit for bit the forward's (checked against the transposed samples: one read of
# each, no writes), so nothing stale is ever used. The weight gradient therefore runs
# before the input gradient (ops/conv.py), whose products take that scratch. On the
# digits CNN's 16->32 convolution (6x6 maps, batch 128) the check took 39 us where the
# transpose and im2col it replaces took 89 (one thread, each alone; in a training step,
# where im2col's 1.2 MB of windows no longer fit in cache, those two took 233).
_KEPT_IN = ("samples", "windows")


def _kept_windows(x: np.ndarray, win: Windows) -> np.ndarray | None:
    """The windows the last whole-batch forward kept, if they are x's (m, C, H, W)."""
    kept = getattr(_SCRATCH, "kept", None)
    if kept is None:
        return None
    kept_win, shape, dtype, inner, cols = kept
    if kept_win != win or shape != x.shape or dtype != x.dtype:
        return None
    return cols if kernels.transposed_equal(x.reshape(shape[0], -1), inner) else None


def _batch_inner_upstream(upstream: np.ndarray) -> np.ndarray:
    """upstream (m, O, OH, OW) as (O, OH OW m), in scratch."""
    m = upstream.shape[0]
    inner = scratch("products", upstream.size, upstream.dtype).reshape(-1, m)
    return kernels.transpose(upstream.reshape(m, -1), inner)


def _conv_batch_inner(x: np.ndarray, weight: np.ndarray, win: Windows, out: np.ndarray,
                      chunks: list, epilogue: Epilogue | None) -> None:
    """The forward on small maps: per chunk and group, weight (O/g, C/g kh kw) times
    the windows (C/g kh kw, OH OW m), transposed into the NCHW `out`."""
    groups, per_group = weight.shape[:2]
    for start, stop in chunks:
        m = stop - start
        cols = _batch_inner_windows(x[start:stop], win, keep=len(chunks) == 1)
        product = scratch("products", groups * per_group * cols.shape[1], x.dtype)
        product = product.reshape(groups, per_group, cols.shape[1])
        np.matmul(weight, cols.reshape(groups, -1, cols.shape[1]), out=product)
        kernels.transpose(product.reshape(-1, m), out[start:stop].reshape(m, -1))
        if epilogue is not None:
            epilogue(out[start:stop].reshape(m, groups * per_group, -1), start, stop)


def _input_backward_batch_inner(upstream: np.ndarray, weight_t: np.ndarray, win: Windows,
                                grad: np.ndarray, chunks: list) -> None:
    """The input gradient on small maps: per chunk and group, weight^T (C/g kh kw, O/g)
    times the upstream (O/g, OH OW m), folded back batch innermost and transposed into
    the NCHW `grad`."""
    groups = weight_t.shape[0]
    c, h, w = grad.shape[1:]
    kh, kw = win.kernel
    oh, ow = win.out_hw
    upstream = np.ascontiguousarray(upstream)
    for start, stop in chunks:
        m = stop - start
        up = _batch_inner_upstream(upstream[start:stop])
        cols = scratch("windows", c * kh * kw * oh * ow * m, grad.dtype)
        cols = cols.reshape(1, c, kh, kw, oh, ow * m)
        np.matmul(weight_t, up.reshape(groups, -1, oh * ow * m),
                  out=cols.reshape(groups, -1, oh * ow * m))
        inner = scratch("samples", c * h * w * m, grad.dtype).reshape(1, c, h, w * m)
        kernels.fold(cols, inner, _batch_inner_geometry(win, m, cols))
        kernels.transpose(inner.reshape(-1, m), grad[start:stop].reshape(m, -1))


def _weight_backward_batch_inner(upstream: np.ndarray, x: np.ndarray,
                                 weight_shape: Sequence[int], win: Windows, groups: int,
                                 chunks: list) -> np.ndarray:
    """The weight gradient on small maps: per chunk and group, the upstream
    (O/g, OH OW m) times the windows transposed (OH OW m, C/g kh kw), summed over the
    chunks: one GEMM whose inner dimension is the batch times the map."""
    upstream = np.ascontiguousarray(upstream)
    grad: np.ndarray | None = None
    for start, stop in chunks:
        cols = _kept_windows(x, win) if len(chunks) == 1 else None
        if cols is None:
            cols = _batch_inner_windows(x[start:stop], win)
        up = _batch_inner_upstream(upstream[start:stop])
        width = cols.shape[1]
        product = np.matmul(up.reshape(groups, -1, width),
                            cols.reshape(groups, -1, width).transpose(0, 2, 1))
        # The first chunk's product is the sum so far (no zeros to add it to).
        grad = product if grad is None else np.add(grad, product, out=grad)
    assert grad is not None  # chunks is never empty
    return grad.reshape(tuple(weight_shape))


def _probe(op: str, shape: Sequence[int], dtype: np.dtype, operands: list) -> np.ndarray:
    # A read-only stand-in of `shape` for the checks, or a KernelError for a bad shape.
    try:
        return np.broadcast_to(np.empty((), dtype), tuple(int(d) for d in shape))
    except (TypeError, ValueError):
        raise KernelError(op, operands, f"invalid shape {shape!r}") from None


def _check_upstream(op: str, upstream: np.ndarray, batch_channels: tuple, win: Windows,
                    other: np.ndarray) -> None:
    expected = (*batch_channels, *win.out_hw)
    if upstream.shape != expected:
        raise KernelError(op, [upstream, other], f"expected an upstream of shape {expected}")
    if upstream.dtype != other.dtype:
        raise KernelError(op, [upstream, other], "upstream and operand dtypes differ")


# ---------------------------------------------------------------- pooling


def check_pool(op: str, x: np.ndarray, kernel: Any, stride: Any, padding: Any,
               dilation: Any = (1, 1)) -> Windows:
    check_float(op, [x])
    win = check_windows(op, x, kernel, stride, padding, dilation=dilation)
    if 2 * win.padding[0] > win.kernel[0] or 2 * win.padding[1] > win.kernel[1]:
        raise KernelError(
            op, [x], f"padding {win.padding} is more than half the kernel {win.kernel}"
        )
    return win


def max_pool2d(x: np.ndarray, kernel: Any, stride: Any, padding: Any,
               dilation: Any = (1, 1), out: np.ndarray | None = None) -> np.ndarray:
    """Maximum over each window, padding reading as -inf; NaN wins."""
    win = check_pool("max_pool2d", x, kernel, stride, padding, dilation)
    out = _result("max_pool2d", [x], (*x.shape[:2], *win.out_hw), x.dtype, out)
    threads = _own_threads(len(x), x.dtype)
    with _crew(threads):
        return kernels.max_pool(x, out, win.geometry(), threads)


def avg_pool2d(x: np.ndarray, kernel: Any, stride: Any, padding: Any,
               out: np.ndarray | None = None) -> np.ndarray:
    """Sum over each window divided by kh * kw (count_include_pad=True)."""
    win = check_pool("avg_pool2d", x, kernel, stride, padding)
    out = _result("avg_pool2d", [x], (*x.shape[:2], *win.out_hw), x.dtype, out)
    return kernels.avg_pool(x, out, win.geometry())


def max_pool2d_backward(
    upstream: np.ndarray, x: np.ndarray, y: np.ndarray, kernel: Any, stride: Any,
    padding: Any, dilation: Any = (1, 1), out: np.ndarray | None = None,
) -> np.ndarray:
    """upstream to the first maximum of each window in row-major order, as PyTorch
    (into `out` when given)."""
    op = "max_pool2d_backward"
    win = check_pool(op, x, kernel, stride, padding, dilation)
    expected = (*x.shape[:2], *win.out_hw)
    if upstream.shape != expected or y.shape != expected:
        raise KernelError(op, [upstream, x, y], f"expected upstream and output of shape "
                                                f"{expected}")
    check_float(op, [upstream, x, y])
    grad = _result(op, [upstream, x, y], x.shape, x.dtype, out)
    return kernels.max_pool_backward(upstream, x, y, grad, win.geometry())


def avg_pool2d_backward(
    upstream: np.ndarray, input_shape: Sequence[int], kernel: Any, stride: Any, padding: Any,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """upstream / (kh kw) added into every position of its window (into `out` when
    given)."""
    op = "avg_pool2d_backward"
    probe = _probe(op, input_shape, upstream.dtype, [upstream])
    win = check_pool(op, probe, kernel, stride, padding)
    expected = (*input_shape[:2], *win.out_hw)
    if upstream.shape != expected:
        raise KernelError(op, [upstream], f"expected an upstream of shape {expected}")
    grad = _result(op, [upstream], tuple(input_shape), upstream.dtype, out)
    return kernels.avg_pool_backward(upstream, grad, win.geometry())
