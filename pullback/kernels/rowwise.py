"""`RowKernel`: a row body applied over the last axis, with inputs and outputs of the
kinds its declaration names (rows, shared vectors, per-row values and indices, scalars;
output rows, per-row values, sums over rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pullback.errors import KernelError
from pullback.kernels import jit
from pullback.kernels.base import _INTP, Kernel, _is_python_scalar
from pullback.kernels.drivers import rows_source

ROW_INPUTS = ("row", "shared", "value", "index", "scalar")
ROW_OUTPUTS = ("row", "value", "sum")


class RowKernel(Kernel):
    """A row body applied over the last axis. Each input is a "row" (..., D) array, a
    "shared" (D,) array passed whole to every row, a "value" (one float per row, shape
    (...)), an "index" (one int per row) or a "scalar"; outputs are "row"s (written by
    the body, passed after the inputs), "sum"s ((D,) accumulators the body adds into,
    passed last, summed over rows) and "value"s (returned by the body, in order)."""

    def __init__(self, fn: Callable, backward: Kernel | None, inputs: Sequence[str] | None,
                 outputs: Sequence[str] | None):
        super().__init__(fn, backward)
        outputs = tuple(outputs) if outputs is not None else ("row",)
        passed = sum(kind != "value" for kind in outputs)
        count = fn.__code__.co_argcount - passed
        inputs = tuple(inputs) if inputs is not None else ("row",) * count
        where = f"@kernel({self.name}, rows=True)"
        if any(k not in ROW_INPUTS for k in inputs) or any(k not in ROW_OUTPUTS for k in outputs):
            raise TypeError(f"{where}: input kinds are {ROW_INPUTS}, output kinds {ROW_OUTPUTS}")
        if len(inputs) != count or "row" not in inputs:
            raise TypeError(f"{where}: {fn.__code__.co_argcount} parameters do not fit inputs "
                            f"{inputs} (at least one 'row') and outputs {outputs}")
        self.inputs = inputs
        self.outputs = outputs
        self.nin = len(inputs)
        self._first_row = inputs.index("row")
        # Outputs in the driver's parameter order: rows, then sums, then values.
        self._order = sorted(range(len(outputs)),
                             key=lambda j: ("row", "sum", "value").index(outputs[j]))
        self._driver_outputs = tuple(outputs[j] for j in self._order)
        # dtype -> driver, for the fast paths' one lookup.
        self._serial_fast: dict[np.dtype, Any] = {}
        self._parallel_fast: dict[np.dtype, Any] = {}
        # Rows in, one row out (softmax and kin) have a fast path of their own.
        simple = outputs == ("row",) and all(kind == "row" for kind in inputs)
        self._fast = self._fast_rows if simple else self._fast_kinds

    # Each entry point tries the fast path inline: a shared helper would cost a call.

    def __call__(self, *args: Any, out: Any = None) -> Any:
        result = self._fast(args, None, out)
        return self._run(args, out, None) if result is None else result

    def serial(self, *args: Any, out: Any = None) -> Any:
        """The call on the calling thread only, whatever the size."""
        result = self._fast(args, False, out)
        return self._run(args, out, False) if result is None else result

    def parallel(self, *args: Any, out: Any = None) -> Any:
        """The call through the parallel loop, whatever the size."""
        result = self._fast(args, True, out)
        return self._run(args, out, True) if result is None else result

    @staticmethod
    def _row_out(out: Any, shape: tuple, dtype: np.dtype) -> np.ndarray | None:
        """`out` where it takes the fast path's result as it is (a C-contiguous array of
        its shape and dtype); None for any other."""
        if (type(out) is np.ndarray and out.shape == shape and out.dtype is dtype
                and out.flags.c_contiguous and out.flags.writeable):
            return out
        return None

    def _fast_rows(self, args: tuple, parallel: bool | None, out: Any = None
                   ) -> np.ndarray | None:
        """_fast_kinds for rows in and one row out, with fewer steps still."""
        if len(args) != self.nin or type(args[0]) is not np.ndarray:
            return None
        first = args[0]
        shape, dtype = first.shape, first.dtype
        for a in args:
            if (type(a) is not np.ndarray or a.shape != shape or a.dtype is not dtype
                    or not a.flags.c_contiguous):
                return None
        if not shape or not shape[-1]:
            return None
        width = shape[-1]
        rows = first.size // width
        if parallel is None:
            parallel = first.size >= self.parallel_threshold and rows > 1
        driver = (self._parallel_fast if parallel else self._serial_fast).get(dtype)
        if driver is None:
            return None
        # Inline for the common call without `out`: a call here is per-op overhead.
        result = np.empty(shape, dtype) if out is None else self._row_out(out, shape, dtype)
        if result is None:
            return None
        if first.ndim == 2:
            driver(rows, *args, result)
        else:
            grid = (rows, width)
            driver(rows, *[a.reshape(grid) for a in args], result.reshape(grid))
        return result

    def _fast_kinds(self, args: tuple, parallel: bool | None, out: Any = None) -> Any:
        """The call on well-formed inputs (C-contiguous arrays of one dtype already
        compiled for, of the shapes their kinds want; `out` None, or a C-contiguous
        result of one row output) in few Python steps; None for anything else, which
        _run then checks, converts or reports."""
        if len(args) != self.nin or (out is not None and self.outputs != ("row",)):
            return None
        first = args[self._first_row]
        if type(first) is not np.ndarray or not first.shape or not first.shape[-1]:
            return None
        shape, dtype = first.shape, first.dtype
        grid, width = shape[:-1], shape[-1]
        rows = first.size // width
        if parallel is None:
            parallel = first.size >= self.parallel_threshold and rows > 1
        driver = (self._parallel_fast if parallel else self._serial_fast).get(dtype)
        if driver is None:
            return None
        values = []
        for value, kind in zip(args, self.inputs):
            if kind == "scalar":
                if type(value) is not float:
                    return None
            elif type(value) is not np.ndarray or not value.flags.c_contiguous:
                return None
            elif kind == "row":
                if value.shape != shape or value.dtype is not dtype:
                    return None
                if value.ndim != 2:
                    value = value.reshape(rows, width)
            elif kind == "shared":
                if value.shape != (width,) or value.dtype is not dtype:
                    return None
            elif value.shape != grid or value.dtype is not (dtype if kind == "value" else _INTP):
                return None
            elif value.ndim != 1:
                value = value.reshape(rows)
            values.append(value)
        if self.outputs == ("row",):
            result = np.empty(shape, dtype) if out is None else \
                self._row_out(out, shape, dtype)
            if result is None:
                return None
            driver(rows, *values, result if len(shape) == 2 else result.reshape(rows, width))
            return result
        return self._launch(driver, rows, values, grid, width, dtype, parallel)

    def _launch(self, driver: Any, rows: int, values: list, grid: tuple, width: int,
                dtype: np.dtype, parallel: bool, outs: list | None = None) -> Any:
        """Run the driver on prepared inputs; returns the outputs in declared order,
        written into `outs` (C-contiguous arrays, or None entries) where given."""
        chunks = min(jit.numba().get_num_threads(), rows) if parallel else 1
        buffers = []
        for kind in self._driver_outputs:
            if kind == "row":
                buffers.append(np.empty((rows, width), dtype))
            elif kind == "sum":
                buffers.append(np.zeros((max(chunks, 1), width), dtype))
            else:
                buffers.append(np.empty(rows, dtype))
        if outs is not None:
            for slot, j in enumerate(self._order):
                if outs[j] is not None and self.outputs[j] != "sum":
                    buffers[slot] = outs[j].reshape(buffers[slot].shape)
        if rows:
            driver(rows, *values, *buffers)
        results: list[np.ndarray | None] = [None] * len(self.outputs)
        for slot, j in enumerate(self._order):
            kind, buffer = self.outputs[j], buffers[slot]
            if kind == "sum":
                buffer = buffer[0] if buffer.shape[0] == 1 else np.add.reduce(buffer, axis=0)
                if outs is not None and outs[j] is not None:
                    outs[j][...] = buffer
                    buffer = outs[j]
            elif outs is not None and outs[j] is not None:
                buffer = outs[j]
            elif kind == "row":
                buffer = buffer.reshape((*grid, width)) if len(grid) != 1 else buffer
            elif len(grid) != 1:
                buffer = buffer.reshape(grid)
            results[j] = buffer
        return results[0] if len(results) == 1 else tuple(results)

    def _source(self, key: tuple) -> str:
        return rows_source(self.inputs, self.outputs)

    def _signature(self, dtype: np.dtype, key: tuple) -> tuple:
        t = jit.numba().types
        kinds = {"row": jit.array_type(dtype, 2, "C", readonly=True),
                 "shared": jit.array_type(dtype, 1, "C", readonly=True),
                 "value": jit.array_type(dtype, 1, "C", readonly=True),
                 "index": jit.array_type(np.dtype(np.intp), 1, "C", readonly=True),
                 "scalar": t.float64}
        outs = {"row": jit.array_type(dtype, 2, "C"), "sum": jit.array_type(dtype, 2, "C"),
                "value": jit.array_type(dtype, 1, "C")}
        ordered = [self.outputs[j] for j in self._order]
        return (t.intp, *[kinds[k] for k in self.inputs], *[outs[k] for k in ordered])

    def _run(self, args: tuple, out: Any, parallel: bool | None) -> Any:
        if len(args) != self.nin:
            raise TypeError(f"{self.name} takes {self.nin} inputs, got {len(args)}")
        values = [a if _is_python_scalar(a) or type(a) is np.ndarray else np.asarray(a)
                  for a in args]
        arrays = [v for v in values if type(v) is np.ndarray]
        floats = [v for v, kind in zip(values, self.inputs) if kind not in ("index", "scalar")]
        dtype = self._common_dtype(floats, arrays)
        first = values[self._first_row]
        if first.ndim == 0:
            raise KernelError(self.name, arrays, "rows need at least one dimension")
        grid, width = first.shape[:-1], first.shape[-1]
        rows = math.prod(grid)
        for i, kind in enumerate(self.inputs):
            values[i] = self._prepare(kind, values[i], grid, width, rows, dtype, arrays)
        if parallel is None:
            parallel = rows * width >= self.parallel_threshold and rows > 1
        outs = self._outputs(out, grid, width, dtype, arrays)
        # Outputs that reshape would copy are computed aside and copied in afterwards.
        direct = None if outs is None else [
            o if o is not None and (kind == "sum" or o.flags.c_contiguous) else None
            for o, kind in zip(outs, self.outputs)]
        driver = self._driver(dtype, (), parallel)
        (self._parallel_fast if parallel else self._serial_fast)[dtype] = driver
        results = self._launch(driver, rows, values, grid, width, dtype, parallel, direct)
        if outs is None:
            return results
        results = list(results) if isinstance(results, tuple) else [results]
        for j, target in enumerate(outs):
            if target is not None and results[j] is not target:
                target[...] = results[j].reshape(target.shape)
                results[j] = target
        return results[0] if len(results) == 1 else tuple(results)

    def _prepare(self, kind: str, value: Any, grid: tuple, width: int, rows: int,
                 dtype: np.dtype, arrays: list) -> Any:
        """One input as the driver takes it: rows (R, D), shared (D,), values (R,)."""
        if kind == "scalar":
            if not _is_python_scalar(value) and np.ndim(value) != 0:
                raise KernelError(self.name, arrays, "a scalar input must be a number")
            return float(value)  # the driver casts it to the kernel's dtype
        if type(value) is not np.ndarray:
            value = np.asarray(value)
        expected = {"row": (*grid, width), "shared": (width,)}.get(kind, grid)
        if value.shape != expected:
            raise KernelError(self.name, arrays,
                         f"a {kind} input must have shape {expected}, got {value.shape}")
        if kind == "index":
            if value.dtype.kind not in "iu":
                raise KernelError(self.name, arrays, f"indices must be integers, got {value.dtype}")
            return np.ascontiguousarray(value, dtype=np.intp).reshape(rows)
        if kind == "shared" or not value.flags.c_contiguous:
            value = np.ascontiguousarray(value)
        return value if kind == "shared" else value.reshape(
            (rows, width) if kind == "row" else (rows,))

    def _outputs(self, out: Any, grid: tuple, width: int, dtype: np.dtype,
                 arrays: list) -> list | None:
        if out is None:
            return None
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(self.outputs):
            raise KernelError(self.name, arrays,
                         f"out= needs {len(self.outputs)} arrays, got {len(outs)}")
        for o, kind in zip(outs, self.outputs):
            expected = {"row": (*grid, width), "sum": (width,)}.get(kind, grid)
            if o is None:
                continue
            if not isinstance(o, np.ndarray) or o.shape != expected or o.dtype != dtype:
                raise KernelError(self.name, [*arrays, o],
                             f"out= for a {kind} output must be a {dtype} array of "
                                  f"shape {expected}")
        return outs
