"""`@kernel`: plain-Python kernel bodies, compiled with Numba per dtype, called on arrays.

An elementwise kernel is scalar code (`def silu(x): return x * sigmoid(x)`) applied
with NumPy broadcasting; a row kernel (`rows=True`) gets 1-D rows of the last axis and
writes output rows. Either is compiled lazily, per dtype (float32, float64) and calling
pattern, into a serial loop and a parallel one (`prange`); calls below
`parallel_threshold` elements take the serial loop, so small arrays pay no thread cost.
A float32 kernel computes in float32: its float literals are float32 (see
compile.in_precision), as NumPy's own float32 loops do.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pullback.kernels import compile as comp
from pullback.kernels.drivers import elementwise_source, rows_source

SUPPORTED_DTYPES: tuple[np.dtype, ...] = (np.dtype(np.float32), np.dtype(np.float64))
_SUPPORTED = "supported: " + ", ".join(d.name for d in SUPPORTED_DTYPES)
# Below this many elements a kernel runs its serial loop: splitting costs more than it
# saves (measured on these machines; PERFORMANCE.md).
PARALLEL_THRESHOLD = 32768

ROW_INPUTS = ("row", "shared", "value", "index", "scalar")
ROW_OUTPUTS = ("row", "value", "sum")


def _error(op: str, operands: Sequence[Any], reason: str) -> Exception:
    """A pullback.backend KernelError, imported on the first error: the backend imports
    the kernels (cpu.py), so a top-level import here would make `import pullback.kernels`
    before `pullback.backend` a cycle."""
    from pullback.backend.errors import KernelError

    return KernelError(op, operands, reason)


class Kernel:
    """What both kernel kinds share: name, Python body, backward pair, dtype dispatch."""

    def __init__(self, fn: Callable, backward: Kernel | None):
        if backward is not None and not isinstance(backward, Kernel):
            raise TypeError(f"@kernel({fn.__name__}): backward must be a kernel, "
                            f"got {type(backward).__name__}")
        self.python = fn
        self.name: str = fn.__name__
        self.backward = backward
        self.parallel_threshold = PARALLEL_THRESHOLD
        self.__doc__ = fn.__doc__
        # (dtype, calling pattern, parallel) -> compiled loop, and (dtype, pattern) -> the
        # generated module holding both loops.
        self._drivers: dict[tuple, Any] = {}
        self._modules: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        pair = f", backward={self.backward.name}" if self.backward is not None else ""
        return f"<{type(self).__name__} {self.name}{pair}>"

    @property
    def signatures(self) -> list[tuple[str, str, str]]:
        """What has been compiled so far: (dtype, loop layout ("flat", "grid" or
        "rows"), "serial" or "parallel") triples."""
        return sorted({(dtype.name, key[0] if key else "rows", "parallel" if parallel else "serial")
                       for dtype, key, parallel in self._drivers})

    def _source(self, key: tuple) -> str:
        raise NotImplementedError

    def _signature(self, dtype: np.dtype, key: tuple) -> tuple:
        raise NotImplementedError

    def _driver(self, dtype: np.dtype, key: tuple, parallel: bool) -> Any:
        found = self._drivers.get((dtype, key, parallel))
        if found is not None:
            return found
        with self._lock:
            found = self._drivers.get((dtype, key, parallel))
            if found is not None:  # another thread compiled it while this one waited
                return found
            module = self._modules.get((dtype, key))
            if module is None:
                module = comp.load_drivers(self.name, self.python, dtype, self._source(key),
                                           inline=isinstance(self, ElementwiseKernel))
                self._modules[(dtype, key)] = module
            driver = module.parallel_loop if parallel else module.serial_loop
            # One explicit signature, inputs read-only and arrays of any alignment, then
            # no more compiling: writable, read-only (pullback's saved arrays) and
            # unaligned arrays all convert to it, where Numba would otherwise compile a
            # specialization for each.
            signature = self._signature(dtype, key)
            if signature not in driver.overloads:  # a module shared by a re-declared body
                driver.compile(signature)
            driver.disable_compile()
            self._drivers[(dtype, key, parallel)] = driver
        return driver

    def _common_dtype(self, arrays: Sequence[np.ndarray], shown: Sequence[Any]) -> np.dtype:
        """The one supported float dtype of `arrays`, or a KernelError listing the
        supported ones."""
        dtype = arrays[0].dtype if arrays else np.dtype(np.float64)
        for a in arrays:
            if a.dtype != dtype:
                names = " and ".join(sorted({x.dtype.name for x in arrays}))
                raise _error(self.name, list(shown), f"mixed dtypes {names}; {_SUPPORTED}")
        if dtype not in SUPPORTED_DTYPES:
            raise _error(self.name, list(shown), f"unsupported dtype {dtype}; {_SUPPORTED}")
        return dtype


_COMPILED = frozenset(SUPPORTED_DTYPES)
_INTP = np.dtype(np.intp)


def _is_python_scalar(value: Any) -> bool:
    return type(value) in (float, int, bool)


class ElementwiseKernel(Kernel):
    """A scalar body applied elementwise with broadcasting; `outputs` > 1 when the body
    returns a tuple. An output may be one of the inputs (same shape): in place."""

    def __init__(self, fn: Callable, backward: Kernel | None, outputs: int = 1):
        super().__init__(fn, backward)
        if not isinstance(outputs, int) or outputs < 1:
            raise TypeError(f"@kernel({self.name}): outputs must be a positive int")
        self.nin = fn.__code__.co_argcount
        self.nout = outputs
        # dtype -> the flat driver for all-array calls: the fast paths' one lookup.
        self._serial_fast: dict[np.dtype, Any] = {}
        self._parallel_fast: dict[np.dtype, Any] = {}
        if outputs == 1 and self.nin in (1, 2):
            self._fast = self._fast_one if self.nin == 1 else self._fast_two
        else:
            self._fast = self._fast_many

    # Each entry point tries the fast path inline: a shared helper would cost a call.

    def __call__(self, *args: Any, out: Any = None) -> Any:
        result = self._fast(args, None) if out is None else None
        return self._run(args, out, None) if result is None else result

    def serial(self, *args: Any, out: Any = None) -> Any:
        """The call on the calling thread only, whatever the size."""
        result = self._fast(args, False) if out is None else None
        return self._run(args, out, False) if result is None else result

    def parallel(self, *args: Any, out: Any = None) -> Any:
        """The call through the parallel loop, whatever the size."""
        result = self._fast(args, True) if out is None else None
        return self._run(args, out, True) if result is None else result

    # The commonest calls in as few Python steps as possible (they dominate small calls):
    # one output, same-shape arrays of a dtype already compiled for. Each returns None
    # for anything else, and the general path takes over. Contiguity is left to Numba's
    # own type check: a strided 1-D array does not fit the flat loop's signature (a
    # TypeError, as compiling more is disabled), and ravel copies a strided N-d one.

    def _fast_one(self, args: tuple, parallel: bool | None) -> np.ndarray | None:
        if len(args) != 1:
            return None
        x = args[0]
        if type(x) is not np.ndarray:
            return None
        if parallel is None:
            parallel = x.size >= self.parallel_threshold
        driver = (self._parallel_fast if parallel else self._serial_fast).get(x.dtype)
        if driver is None:
            return None
        result = np.empty(x.shape, x.dtype)
        try:
            if x.ndim == 1:
                driver(x, result)
            else:
                driver(x.ravel(), result.ravel())
        except TypeError:
            return None
        return result

    def _fast_two(self, args: tuple, parallel: bool | None) -> np.ndarray | None:
        if len(args) != 2:
            return None
        a, b = args
        if (type(a) is not np.ndarray or type(b) is not np.ndarray or a.shape != b.shape
                or a.dtype is not b.dtype):
            return None
        if parallel is None:
            parallel = a.size >= self.parallel_threshold
        driver = (self._parallel_fast if parallel else self._serial_fast).get(a.dtype)
        if driver is None:
            return None
        result = np.empty(a.shape, a.dtype)
        try:
            if a.ndim == 1:
                driver(a, b, result)
            else:
                driver(a.ravel(), b.ravel(), result.ravel())
        except TypeError:
            return None
        return result

    def _fast_many(self, args: tuple, parallel: bool | None) -> np.ndarray | None:
        if self.nout != 1 or len(args) != self.nin or type(args[0]) is not np.ndarray:
            return None
        first = args[0]
        dtype, shape = first.dtype, first.shape
        for a in args:
            if (type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype
                    or not a.flags.c_contiguous):
                return None
        if parallel is None:
            parallel = first.size >= self.parallel_threshold
        driver = (self._parallel_fast if parallel else self._serial_fast).get(dtype)
        if driver is None:
            return None
        result = np.empty(shape, dtype)
        driver(*[a.ravel() for a in args], result.ravel())
        return result

    def _source(self, key: tuple) -> str:
        return elementwise_source(self.nin, self.nout, key)

    def _signature(self, dtype: np.dtype, key: tuple) -> tuple:
        layout, mask, flags = key
        ndim, order = (1, "C") if layout == "flat" else (2, "A")
        t = comp.numba().types
        inputs = [comp.array_type(dtype, ndim, order, readonly=True) if mask >> i & 1
                  else t.boolean if flags >> i & 1 else t.float64 for i in range(self.nin)]
        outputs = [comp.array_type(dtype, ndim, order)] * self.nout
        return (*inputs, *outputs)

    def _run(self, args: tuple, out: Any, parallel: bool | None) -> Any:
        if len(args) != self.nin:
            raise TypeError(f"{self.name} takes {self.nin} inputs, got {len(args)}")
        values = list(args)
        arrays = []
        mask = flags = 0  # which arguments are arrays, which are bools
        flat = True  # same-shape C-contiguous arrays of one dtype: the flat loop
        for i, a in enumerate(args):
            kind = type(a)
            if kind is float:
                continue
            if kind is int:
                values[i] = float(a)  # the drivers take number scalars as float64
                continue
            if kind is bool:
                flags |= 1 << i
                continue
            if kind is not np.ndarray:
                a = values[i] = np.asarray(a)
            if arrays and (a.shape != arrays[0].shape or a.dtype is not arrays[0].dtype):
                flat = False
            if not a.flags.c_contiguous:
                flat = False
            arrays.append(a)
            mask |= 1 << i
        if flat and arrays and arrays[0].dtype in _COMPILED:
            dtype, shape = arrays[0].dtype, arrays[0].shape
        else:
            dtype = self._common_dtype(arrays, arrays or values)
            shape = self._shape(arrays)
        outs = self._outputs(out, shape, dtype, arrays)
        size = math.prod(shape)
        if size:
            if parallel is None:
                parallel = size >= self.parallel_threshold
            # Number scalars go in as Python numbers (cheap to pass) and the driver casts
            # them to the kernel's dtype, as NumPy's weak scalars; bools stay flags.
            if flat and all(o.flags.c_contiguous for o in outs):
                self._flat(values, outs, dtype, (mask, flags), parallel)
            else:
                self._grid(values, outs, shape, dtype, (mask, flags), parallel)
        return outs[0] if self.nout == 1 else tuple(outs)

    def _shape(self, arrays: list) -> tuple:
        """The broadcast shape of `arrays`, or a KernelError."""
        try:
            return np.broadcast_shapes(*(a.shape for a in arrays))
        except ValueError:
            raise _error(self.name, arrays, "shapes cannot be broadcast together") from None

    def _outputs(self, out: Any, shape: tuple, dtype: np.dtype, arrays: list) -> list:
        if out is None:
            return [np.empty(shape, dtype) for _ in range(self.nout)]
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != self.nout:
            raise _error(self.name, arrays, f"out= needs {self.nout} arrays, got {len(outs)}")
        for o in outs:
            if type(o) is not np.ndarray or o.shape != shape or o.dtype != dtype:
                raise _error(self.name, [*arrays, o],
                             f"out= must be a {dtype} array of shape {shape}")
            if not o.flags.writeable:
                raise _error(self.name, [*arrays, o], "out= is read-only")
        return outs

    def _flat(self, values: list, outs: list, dtype: np.dtype, masks: tuple[int, int],
              parallel: bool) -> None:
        mask = masks[0]
        for i, v in enumerate(values):
            if mask >> i & 1 and v.ndim != 1:
                values[i] = v.ravel()
        key = ("flat", *masks)
        driver = self._drivers.get((dtype, key, parallel))
        if driver is None:
            driver = self._driver(dtype, key, parallel)
            if mask == (1 << self.nin) - 1:
                (self._parallel_fast if parallel else self._serial_fast)[dtype] = driver
        driver(*values, *[o if o.ndim == 1 else o.ravel() for o in outs])

    def _grid(self, values: list, outs: list, shape: tuple, dtype: np.dtype,
              masks: tuple[int, int], parallel: bool) -> None:
        # Broadcast views as (rows, last axis): zero strides are fine for Numba's 'A'
        # arrays; reshape copies only for strides it cannot merge.
        grid = (math.prod(shape[:-1]), shape[-1]) if shape else (1, 1)
        for i in range(self.nin):
            if masks[0] >> i & 1:
                values[i] = np.broadcast_to(values[i], shape).reshape(grid)
        targets = [o.reshape(grid) if o.flags.c_contiguous else np.empty(grid, dtype)
                   for o in outs]
        self._driver(dtype, ("grid", *masks), parallel)(*values, *targets)
        for o, t in zip(outs, targets):
            if not o.flags.c_contiguous:
                o[...] = t.reshape(shape)


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
        result = self._fast(args, None) if out is None else None
        return self._run(args, out, None) if result is None else result

    def serial(self, *args: Any, out: Any = None) -> Any:
        """The call on the calling thread only, whatever the size."""
        result = self._fast(args, False) if out is None else None
        return self._run(args, out, False) if result is None else result

    def parallel(self, *args: Any, out: Any = None) -> Any:
        """The call through the parallel loop, whatever the size."""
        result = self._fast(args, True) if out is None else None
        return self._run(args, out, True) if result is None else result

    def _fast_rows(self, args: tuple, parallel: bool | None) -> np.ndarray | None:
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
        result = np.empty(shape, dtype)
        if first.ndim == 2:
            driver(rows, *args, result)
        else:
            grid = (rows, width)
            driver(rows, *[a.reshape(grid) for a in args], result.reshape(grid))
        return result

    def _fast_kinds(self, args: tuple, parallel: bool | None) -> Any:
        """The call on well-formed inputs (C-contiguous arrays of one dtype already
        compiled for, of the shapes their kinds want) in few Python steps; None for
        anything else, which _run then checks, converts or reports."""
        if len(args) != self.nin:
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
            result = np.empty(shape, dtype)
            driver(rows, *values, result if len(shape) == 2 else result.reshape(rows, width))
            return result
        return self._launch(driver, rows, values, grid, width, dtype, parallel)

    def _launch(self, driver: Any, rows: int, values: list, grid: tuple, width: int,
                dtype: np.dtype, parallel: bool, outs: list | None = None) -> Any:
        """Run the driver on prepared inputs; returns the outputs in declared order,
        written into `outs` (C-contiguous arrays, or None entries) where given."""
        chunks = min(comp.numba().get_num_threads(), rows) if parallel else 1
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
        results = [None] * len(self.outputs)
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
        t = comp.numba().types
        kinds = {"row": comp.array_type(dtype, 2, "C", readonly=True),
                 "shared": comp.array_type(dtype, 1, "C", readonly=True),
                 "value": comp.array_type(dtype, 1, "C", readonly=True),
                 "index": comp.array_type(np.dtype(np.intp), 1, "C", readonly=True),
                 "scalar": t.float64}
        outs = {"row": comp.array_type(dtype, 2, "C"), "sum": comp.array_type(dtype, 2, "C"),
                "value": comp.array_type(dtype, 1, "C")}
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
            raise _error(self.name, arrays, "rows need at least one dimension")
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
                raise _error(self.name, arrays, "a scalar input must be a number")
            return float(value)  # the driver casts it to the kernel's dtype
        if type(value) is not np.ndarray:
            value = np.asarray(value)
        expected = {"row": (*grid, width), "shared": (width,)}.get(kind, grid)
        if value.shape != expected:
            raise _error(self.name, arrays,
                         f"a {kind} input must have shape {expected}, got {value.shape}")
        if kind == "index":
            if value.dtype.kind not in "iu":
                raise _error(self.name, arrays, f"indices must be integers, got {value.dtype}")
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
            raise _error(self.name, arrays,
                         f"out= needs {len(self.outputs)} arrays, got {len(outs)}")
        for o, kind in zip(outs, self.outputs):
            expected = {"row": (*grid, width), "sum": (width,)}.get(kind, grid)
            if o is None:
                continue
            if not isinstance(o, np.ndarray) or o.shape != expected or o.dtype != dtype:
                raise _error(self.name, [*arrays, o],
                             f"out= for a {kind} output must be a {dtype} array of "
                                  f"shape {expected}")
        return outs


def kernel(fn: Callable | None = None, *, backward: Kernel | None = None, rows: bool = False,
           inputs: Sequence[str] | None = None, outputs: Any = None) -> Any:
    """Declare a kernel: `@kernel`, `@kernel(backward=k)`, `@kernel(outputs=2)` for an
    elementwise body returning two values, `@kernel(rows=True)` for a row body
    `f(x_row, out_row)` (kinds as RowKernel says). Returns the callable kernel:
    `k(*arrays, out=None)`, with `k.backward`, `k.name`, `k.python`."""

    def wrap(body: Callable) -> Kernel:
        if rows:
            return RowKernel(body, backward, inputs, outputs)
        if inputs is not None:
            raise TypeError(f"@kernel({body.__name__}): inputs= is for rows=True kernels")
        return ElementwiseKernel(body, backward, 1 if outputs is None else outputs)

    return wrap if fn is None else wrap(fn)
