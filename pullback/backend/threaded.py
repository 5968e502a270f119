"""`ThreadedCpuBackend`: CpuBackend with large elementwise, row-wise and reduction work
split into contiguous chunks over a thread pool (NumPy releases the GIL). Small ops,
matmul, attention and conv run exactly as in CpuBackend, which splits the large ones
over BLAS's threads itself (pullback.backend.split).
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from pullback.backend import cpu
from pullback.backend.base import Backend, Operand, Shape
from pullback.backend.cpu import CpuBackend
from pullback.errors import KernelError
from pullback.kernels.elementwise import ElementwiseKernel, fortran_call, transpose_all


def _named(op: str, method: cpu.Method) -> cpu.Method:
    method.__name__ = method.__qualname__ = op
    method.__doc__ = getattr(Backend, op, getattr(CpuBackend, op)).__doc__
    return method


def _split_float_unary(op: str, kernel: Callable[..., np.ndarray]) -> cpu.Method:
    def method(self: ThreadedCpuBackend, x: np.ndarray) -> np.ndarray:
        if x.dtype.kind != "f":
            raise KernelError(op, [x], "expected a floating dtype")
        if x.size < self.parallel_threshold:
            return kernel(x, out=...)
        return self._map(kernel, (x,), x.shape, x.dtype)

    return _named(op, method)


def _split_any_unary(op: str, ufunc: np.ufunc) -> cpu.Method:
    whole = getattr(CpuBackend, op)

    def method(self: ThreadedCpuBackend, x: np.ndarray) -> np.ndarray:
        if x.size < self.parallel_threshold or x.dtype == np.bool_:
            return whole(self, x)  # bools take CpuBackend's path to its error
        return self._map(ufunc, (x,), x.shape, x.dtype)

    return _named(op, method)


def _weak_dtype(value: Any) -> Any:
    # Python scalars resolve as NumPy 2's weak scalars: f32 + 1.5 stays f32.
    return type(value) if isinstance(value, (bool, int, float, complex)) else np.result_type(value)


def _split_binary(op: str, ufunc: np.ufunc) -> cpu.Method:
    def method(self: ThreadedCpuBackend, a: Operand, b: Operand) -> np.ndarray:
        try:
            limit = self.parallel_threshold
            if getattr(a, "size", 1) < limit and getattr(b, "size", 1) < limit:
                return ufunc(a, b, out=...)
            shape = np.broadcast_shapes(np.shape(a), np.shape(b))
            dtype = ufunc.resolve_dtypes((_weak_dtype(a), _weak_dtype(b), None))[-1]
            return self._map(ufunc, (a, b), shape, dtype)
        except (ValueError, TypeError) as exc:
            raise cpu.binary_error(op, a, b, exc) from None

    return _named(op, method)


class ThreadedCpuBackend(CpuBackend):
    """CpuBackend whose large elementwise ops run over `num_threads` threads."""

    name = "cpu-threaded"
    # Below this many output elements an op runs whole on the calling thread: splitting
    # costs more than it saves (measured on these machines at about 32k elements).
    parallel_threshold: int = 32768

    def __init__(self, num_threads: int | None = None) -> None:
        self.num_threads = max(1, int(num_threads or os.cpu_count() or 1))
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    # The calling thread runs one chunk itself, so the pool needs one fewer.
                    pool = ThreadPoolExecutor(
                        max_workers=max(1, self.num_threads - 1), thread_name_prefix="pullback-cpu"
                    )
                    atexit.register(pool.shutdown, wait=False)
                    self._pool = pool
        return self._pool

    def close(self) -> None:
        """Shut the thread pool down; a later large op starts a new one."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    # -- splitting ---------------------------------------------------------------------------

    def _bounds(self, length: int) -> list[tuple[int, int]]:
        parts = min(self.num_threads, length)
        cuts = [length * k // parts for k in range(parts + 1)]
        return [(lo, hi) for lo, hi in itertools.pairwise(cuts) if hi > lo]

    def _run(self, kernel: Callable, jobs: Sequence[tuple[tuple, dict]]) -> None:
        if len(jobs) < 2:
            for args, kwargs in jobs:
                kernel(*args, **kwargs)
            return
        pool = self._executor()
        futures = [pool.submit(kernel, *args, **kwargs) for args, kwargs in jobs[1:]]
        args, kwargs = jobs[0]
        kernel(*args, **kwargs)
        for future in futures:
            future.result()

    def runs_plan_kernels(self) -> bool:
        # This type only: a subclass may override an op, which a plan's kernel would skip.
        return type(self) is ThreadedCpuBackend

    def launch_elementwise(self, kernel: ElementwiseKernel, operands: tuple[Operand, ...],
                           out: np.ndarray | None = None) -> Callable[..., Any]:
        return lambda *arrays, out=None: self.map_kernel(kernel, arrays, out)

    def map_kernel(self, kernel: Callable[..., np.ndarray], operands: tuple[Operand, ...],
                   out: np.ndarray | None = None) -> np.ndarray:
        """An elementwise kernel (`kernel(*operands, out=...)`, broadcasting) split over the
        pool when the result is large: what a plan's fused chains run through."""
        arrays = [op for op in operands if isinstance(op, np.ndarray)]
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
        if int(np.prod(shape)) < self.parallel_threshold:
            return kernel(*operands, out=out)
        return self._map(kernel, operands, shape, arrays[0].dtype, out=out)

    def _map(
        self, kernel: Callable, operands: tuple, shape: Shape, dtype: Any, *extra: Any,
        axis: int | None = None, out: np.ndarray | None = None,
    ) -> np.ndarray:
        """kernel(*operand chunks, *extra, out=out chunk) over chunks of `out` (or of a
        fresh output); `axis` (if given) is the one axis that must not be split."""
        if axis is None and len(shape) > 1:
            arrays = [op for op in operands if isinstance(op, np.ndarray)]
            if fortran_call(arrays, tuple(shape), out):
                # Laid out by columns (a GEMM's result): split the transposes, so each
                # thread's part is contiguous, and give back a result ordered the same.
                if out is None:
                    out = np.empty(shape, dtype=dtype, order="F")
                self._map(kernel, tuple(transpose_all(operands, len(shape))),
                          tuple(shape)[::-1], dtype, *extra, out=out.T)
                return out
        if out is None:
            out = np.empty(shape, dtype=dtype)
        flat = axis is None and all(
            not isinstance(op, np.ndarray) or (op.shape == out.shape and op.flags.c_contiguous)
            for op in operands
        )
        if flat:
            views = [op.reshape(-1) if isinstance(op, np.ndarray) else op for op in operands]
            jobs = [
                ((*[v[lo:hi] if isinstance(v, np.ndarray) else v for v in views], *extra),
                 {"out": out.reshape(-1)[lo:hi]})
                for lo, hi in self._bounds(out.size)
            ]
        else:
            split = 0 if axis != 0 else 1
            if out.ndim <= split or out.shape[split] < 2:
                kernel(*operands, *extra, out=out)
                return out
            jobs = [
                ((*[_take(op, out.ndim, split, lo, hi) for op in operands], *extra),
                 {"out": _take(out, out.ndim, split, lo, hi)})
                for lo, hi in self._bounds(out.shape[split])
            ]
        self._run(kernel, jobs)
        return out

    # -- split ops ---------------------------------------------------------------------------

    neg = _split_any_unary("neg", np.negative)
    abs = _split_any_unary("abs", np.absolute)
    sign = _split_any_unary("sign", np.sign)
    exp = _split_float_unary("exp", np.exp)
    log = _split_float_unary("log", cpu.log_kernel)
    sqrt = _split_float_unary("sqrt", np.sqrt)
    relu = _split_float_unary("relu", cpu.relu_kernel)
    sigmoid = _split_float_unary("sigmoid", cpu.sigmoid_kernel)
    tanh = _split_float_unary("tanh", np.tanh)
    silu = _split_float_unary("silu", cpu.silu_kernel)
    softplus = _split_float_unary("softplus", cpu.softplus_kernel)
    erf = _split_float_unary("erf", cpu.erf_kernel)
    sin = _split_float_unary("sin", np.sin)
    cos = _split_float_unary("cos", np.cos)

    def gelu(self, x: np.ndarray, approximate: str = "none") -> np.ndarray:
        kernel = cpu.gelu_kernel_for("gelu", x, approximate)
        if x.size < self.parallel_threshold:
            return kernel(x)
        return self._map(kernel, (x,), x.shape, x.dtype)

    add = _split_binary("add", np.add)
    sub = _split_binary("sub", np.subtract)
    mul = _split_binary("mul", np.multiply)
    div = _split_binary("div", np.true_divide)
    pow = _split_binary("pow", np.power)
    maximum = _split_binary("maximum", np.maximum)
    minimum = _split_binary("minimum", np.minimum)
    less = _split_binary("less", np.less)
    less_equal = _split_binary("less_equal", np.less_equal)
    greater = _split_binary("greater", np.greater)
    greater_equal = _split_binary("greater_equal", np.greater_equal)
    equal = _split_binary("equal", np.equal)
    not_equal = _split_binary("not_equal", np.not_equal)

    def where(self, cond: np.ndarray, a: Operand, b: Operand) -> np.ndarray:
        small = max(np.size(cond), np.size(a), np.size(b)) < self.parallel_threshold
        if small or getattr(cond, "dtype", None) != np.bool_:
            return super().where(cond, a, b)  # np.copyto's mask must be bool
        try:
            shape = np.broadcast_shapes(np.shape(cond), np.shape(a), np.shape(b))
            dtype = np.result_type(_weak_value(a), _weak_value(b))
        except (ValueError, TypeError):
            return super().where(cond, a, b)
        return self._map(_where_kernel, (cond, a, b), shape, dtype)

    def clip(self, x: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
        if x.size < self.parallel_threshold or (lo is None and hi is None):
            return super().clip(x, lo, hi)
        try:
            dtype = np.result_type(x, *(_weak_value(v) for v in (lo, hi) if v is not None))
        except (ValueError, TypeError):
            return super().clip(x, lo, hi)
        return self._map(_clip_kernel, (x,), x.shape, dtype, lo, hi)

    def reduce_sum(self, x: np.ndarray, axes: Shape, keepdims: bool) -> np.ndarray:
        kept = [a for a in range(x.ndim) if a not in axes]
        if x.size < self.parallel_threshold or not kept or not axes or x.shape[kept[0]] < 2:
            return super().reduce_sum(x, axes, keepdims)
        try:
            # The reduction's dtype (bools and small ints widen), from a one-element corner.
            dtype = np.add.reduce(x[(slice(0, 1),) * x.ndim], axis=axes, out=...).dtype
        except (ValueError, TypeError):
            return super().reduce_sum(x, axes, keepdims)
        if keepdims:
            shape = tuple(1 if a in axes else size for a, size in enumerate(x.shape))
        else:
            shape = tuple(x.shape[a] for a in kept)
        out = np.empty(shape, dtype=dtype)
        # Split x along its first kept axis: output axis kept[0] with keepdims, else 0.
        split_in = kept[0]
        split_out = split_in if keepdims else 0
        jobs = [
            ((_take(x, x.ndim, split_in, lo, hi),),
             {"axis": axes, "keepdims": keepdims, "out": _take(out, out.ndim, split_out, lo, hi)})
            for lo, hi in self._bounds(x.shape[split_in])
        ]
        self._run(np.add.reduce, jobs)
        return out

    def softmax(self, x: np.ndarray, axis: int) -> np.ndarray:
        return self._rowwise("softmax", cpu.softmax_kernel, x, axis)

    def log_softmax(self, x: np.ndarray, axis: int) -> np.ndarray:
        return self._rowwise("log_softmax", cpu.log_softmax_kernel, x, axis)

    def cumsum(self, x: np.ndarray, axis: int, reverse: bool = False) -> np.ndarray:
        if x.size < self.parallel_threshold or x.ndim < 2 or x.dtype.kind != "f" \
                or not 0 <= axis < x.ndim:
            return super().cumsum(x, axis, reverse)  # small, one row, or ints that widen
        return self._map(cpu.cumsum_kernel, (x,), x.shape, x.dtype, axis, reverse, axis=axis)

    def _rowwise(self, op: str, kernel: Callable, x: np.ndarray, axis: int) -> np.ndarray:
        if x.size < self.parallel_threshold or not -x.ndim <= axis < x.ndim or x.ndim < 2:
            return cpu.rowwise_op(op, kernel, x, axis)
        cpu.float_check(op, x)
        return self._map(kernel, (x,), x.shape, x.dtype, axis % x.ndim, axis=axis % x.ndim)

    def _fused(self, kernel: Any, *args: Any) -> Any:
        # Fused row kernels thread themselves, through Numba's prange and thread count
        # (NUMBA_NUM_THREADS), above the same threshold: their backward sums need one
        # partial row per thread, which splitting the rows here would not give.
        return kernel(*args) if self.num_threads > 1 else kernel.serial(*args)

    def _parallel_planes(self, x: np.ndarray) -> bool:
        # Batch norm's plane kernels thread over channels, as the row kernels do over rows.
        return self.num_threads > 1 and x.size >= self.parallel_threshold

    # -- split backward kernels ----------------------------------------------------------------

    def _backward(
        self, kernel: Callable, upstream: np.ndarray, saved: np.ndarray, dtype: Any = None,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        if upstream.size < self.parallel_threshold or upstream.shape != saved.shape:
            return kernel(upstream, saved, out=... if out is None else out)
        dtype = np.result_type(upstream, saved) if dtype is None else dtype
        return self._map(kernel, (upstream, saved), upstream.shape, dtype, out=out)

    def relu_backward(self, upstream: np.ndarray, forward_input: np.ndarray,
                      out: np.ndarray | None = None) -> np.ndarray:
        # upstream times a bool mask keeps upstream's dtype.
        return self._backward(cpu.relu_backward_kernel, upstream, forward_input, upstream.dtype,
                              out)

    def sigmoid_backward(self, upstream: np.ndarray, forward_output: np.ndarray) -> np.ndarray:
        return self._backward(cpu.sigmoid_backward_kernel, upstream, forward_output)

    def tanh_backward(self, upstream: np.ndarray, forward_output: np.ndarray) -> np.ndarray:
        return self._backward(cpu.tanh_backward_kernel, upstream, forward_output)

    def exp_backward(self, upstream: np.ndarray, forward_output: np.ndarray) -> np.ndarray:
        return self._backward(np.multiply, upstream, forward_output)

    def log_backward(self, upstream: np.ndarray, forward_input: np.ndarray) -> np.ndarray:
        return self._backward(np.divide, upstream, forward_input)

    def sqrt_backward(self, upstream: np.ndarray, forward_output: np.ndarray) -> np.ndarray:
        return self._backward(cpu.sqrt_backward_kernel, upstream, forward_output)

    def abs_backward(self, upstream: np.ndarray, forward_input: np.ndarray) -> np.ndarray:
        return self._backward(cpu.abs_backward_kernel, upstream, forward_input)

    def silu_backward(self, upstream: np.ndarray, forward_input: np.ndarray) -> np.ndarray:
        return self._backward(cpu.silu_backward_kernel, upstream, forward_input)

    def softplus_backward(self, upstream: np.ndarray, forward_input: np.ndarray) -> np.ndarray:
        return self._backward(cpu.softplus_backward_kernel, upstream, forward_input)

    def gelu_backward(
        self, upstream: np.ndarray, forward_input: np.ndarray, approximate: str = "none"
    ) -> np.ndarray:
        kernel = cpu.gelu_backward_kernel_for(upstream, forward_input, approximate)
        return self._backward(kernel, upstream, forward_input)

    def softmax_backward(
        self, upstream: np.ndarray, forward_output: np.ndarray, axis: int
    ) -> np.ndarray:
        return self._rowwise_backward(cpu.softmax_backward_kernel, upstream, forward_output, axis)

    def log_softmax_backward(
        self, upstream: np.ndarray, forward_output: np.ndarray, axis: int
    ) -> np.ndarray:
        return self._rowwise_backward(
            cpu.log_softmax_backward_kernel, upstream, forward_output, axis
        )

    def _rowwise_backward(
        self, kernel: Callable, upstream: np.ndarray, y: np.ndarray, axis: int
    ) -> np.ndarray:
        if upstream.size < self.parallel_threshold or upstream.shape != y.shape or y.ndim < 2:
            return kernel(upstream, y, axis, out=...)
        axis %= y.ndim
        dtype = np.result_type(upstream, y)
        return self._map(kernel, (upstream, y), y.shape, dtype, axis, axis=axis)


def _take(value: Any, ndim: int, axis: int, lo: int, hi: int) -> Any:
    """value[lo:hi] along output axis `axis`, or value whole where it broadcasts there."""
    if not isinstance(value, np.ndarray):
        return value
    own = axis - (ndim - value.ndim)
    if own < 0 or value.shape[own] == 1:
        return value
    index = [slice(None)] * value.ndim
    index[own] = slice(lo, hi)
    return value[tuple(index)]


def _weak_value(value: Any) -> Any:
    # np.result_type treats Python scalars as weak under NumPy 2, arrays by their dtype.
    return value if isinstance(value, (bool, int, float, complex)) else np.asarray(value).dtype


def _where_kernel(cond: Any, a: Any, b: Any, out: np.ndarray) -> np.ndarray:
    np.copyto(out, b)
    np.copyto(out, a, where=cond)
    return out


def _clip_kernel(x: np.ndarray, lo: Any, hi: Any, out: np.ndarray) -> np.ndarray:
    return np.clip(x, lo, hi, out=out)
