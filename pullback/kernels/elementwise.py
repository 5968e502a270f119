"""`ElementwiseKernel`: a scalar body applied with NumPy broadcasting.

Fast paths for the common calls (same-shape contiguous arrays of a compiled dtype) keep
a small call within a microsecond of the bare compiled loop; everything else (Python
scalars, broadcasting, strides, out=, errors) takes the general path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from pullback.errors import KernelError
from pullback.kernels import jit
from pullback.kernels.base import _COMPILED, Kernel
from pullback.kernels.drivers import elementwise_source


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
        result = self._fast(args, None) if out is None else self._fast_into(args, out, None)
        return self._run(args, out, None) if result is None else result

    def serial(self, *args: Any, out: Any = None) -> Any:
        """The call on the calling thread only, whatever the size."""
        result = self._fast(args, False) if out is None else self._fast_into(args, out, False)
        return self._run(args, out, False) if result is None else result

    def parallel(self, *args: Any, out: Any = None) -> Any:
        """The call through the parallel loop, whatever the size."""
        result = self._fast(args, True) if out is None else self._fast_into(args, out, True)
        return self._run(args, out, True) if result is None else result

    # The commonest calls in as few Python steps as possible (they dominate small calls):
    # one output, same-shape arrays of a dtype already compiled for. Each returns None
    # for anything else, and the general path takes over. A 1-D array's contiguity is
    # left to Numba's own type check: a strided one does not fit the flat loop's
    # signature (a TypeError, as compiling more is disabled). N-d ones run flat in
    # memory order when all are C- or all Fortran-contiguous (a GEMM's result may be
    # laid out by columns), and go to the general path otherwise.

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
        try:
            if x.ndim == 1:
                result = np.empty(x.shape, x.dtype)
                driver(x, result)
                return result
            order = _memory_order(x, x)
            if order is None:
                return None
            result = np.empty(x.shape, x.dtype, order=order)
            driver(x.ravel(order), result.ravel(order))
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
        try:
            if a.ndim == 1:
                result = np.empty(a.shape, a.dtype)
                driver(a, b, result)
                return result
            order = _memory_order(a, b)
            if order is None:
                return None
            result = np.empty(a.shape, a.dtype, order=order)
            driver(a.ravel(order), b.ravel(order), result.ravel(order))
        except TypeError:
            return None
        return result

    def _fast_into(self, args: tuple, out: Any, parallel: bool | None) -> np.ndarray | None:
        # One output written into a given array (a plan's buffer): the flat loop when the
        # arrays and `out` share shape and dtype and are all C- or all Fortran-contiguous
        # (a buffer laid out like a GEMM's result by columns), none of them `out` itself.
        if self.nout != 1 or type(out) is not np.ndarray or not out.flags.writeable:
            return None
        shape, dtype = out.shape, out.dtype
        for a in args:
            if type(a) is not np.ndarray or a.shape != shape or a.dtype is not dtype or a is out:
                return None
        order: Literal["C", "F"]
        if all(a.flags.c_contiguous for a in args) and out.flags.c_contiguous:
            order = "C"
        elif all(a.flags.f_contiguous for a in args) and out.flags.f_contiguous:
            order = "F"
        else:
            return None
        if parallel is None:
            parallel = out.size >= self.parallel_threshold
        driver = (self._parallel_fast if parallel else self._serial_fast).get(dtype)
        if driver is None or len(args) != self.nin:
            return None
        try:
            driver(*[a.ravel(order) for a in args], out.ravel(order))
        except TypeError:
            return None
        return out

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

    def launcher(self, args: Sequence[Any], out: np.ndarray | None = None) -> Callable | None:
        """The call prepared for arguments of these shapes and dtypes (writing into `out`,
        or into a fresh array when it is None): `launch(*args, out=out)` then only
        reshapes and runs the compiled loop, about 3 us where a call's own checks cost
        9 more. For callers whose shapes never change (a plan's fused chains). None
        when the call needs the general path (another layout, dtype or thread count)."""
        if self.nout != 1 or len(args) != self.nin:
            return None
        mask = flags = 0
        arrays = []
        for i, a in enumerate(args):
            if type(a) is bool:
                flags |= 1 << i
            elif type(a) is np.ndarray:
                arrays.append(a)
                mask |= 1 << i
            elif type(a) not in (float, int):
                return None
        if not arrays or any(a.dtype is not arrays[0].dtype for a in arrays):
            return None
        dtype = arrays[0].dtype
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
        if fortran_call(arrays, shape, out):
            return self._transposed_launcher(args, shape, out)
        size = math.prod(shape)
        if (dtype not in _COMPILED or not size or size >= self.parallel_threshold
                or (out is not None and (out.shape != shape or out.dtype != dtype
                                         or not out.flags.c_contiguous))):
            return None
        key: tuple[Any, ...]
        if all(a.shape == shape and a.flags.c_contiguous for a in arrays):
            key, grid = ("flat", mask, flags), (size,)
            forms = [(size,) if mask >> i & 1 else None for i in range(self.nin)]
        else:
            found = _contiguous_layout(list(args), mask, shape, dtype)
            if found is None:
                return None
            layout, grid, kinds = found
            key = (layout, mask, flags, kinds)
            forms = _forms(kinds, grid)
        driver = self._driver(dtype, key, False)
        numbers = [i for i, a in enumerate(args) if type(a) is int]  # drivers take floats

        def launch(*current: Any, out: np.ndarray | None = None) -> np.ndarray:
            result = np.empty(shape, dtype) if out is None else out
            operands = [v if form is None else v.reshape(form)
                        for v, form in zip(current, forms)]
            for i in numbers:
                operands[i] = float(operands[i])
            driver(*operands, result.reshape(grid))
            return result

        return launch

    def in_place(self, args: tuple, out: tuple) -> Callable | None:
        """The call prepared for writing every output through one of its inputs (an
        optimizer's parameter and state): `launch(*args)` then runs the compiled loop
        on arguments laid out as these, the outputs being the same inputs, in about a
        third of a call's time. For callers that hold those arrays across calls (an
        optimizer, per parameter). None when the call needs the general path."""
        outs = _as_list(out)
        if len(args) != self.nin or len(outs) != self.nout:
            return None
        if any(type(a) not in (np.ndarray, bool, float, int) for a in args):
            return None
        alias = tuple(next((i for i, a in enumerate(args) if a is o), -1) for o in outs)
        arrays = [a for a in args if type(a) is np.ndarray]
        if -1 in alias or not arrays:
            return None
        dtype, shape = arrays[0].dtype, arrays[0].shape
        if (dtype not in _COMPILED or math.prod(shape) >= self.parallel_threshold
                or any(a.shape != shape or a.dtype is not dtype or not a.flags.c_contiguous
                       for a in arrays)
                or any(not o.flags.writeable for o in outs)):
            return None
        mask = sum(1 << i for i, a in enumerate(args) if type(a) is np.ndarray)
        flags = sum(1 << i for i, a in enumerate(args) if type(a) is bool)
        driver = self._driver(dtype, ("flat", mask, flags, alias), False)
        kinds = tuple("a" if mask >> i & 1 else "n" if type(a) is int else "-"
                      for i, a in enumerate(args))

        def launch(*current: Any) -> None:
            # reshape(-1) is a view of the outputs (C-ordered, checked above) and of any
            # C-ordered input; another input is read through a copy.
            driver(*[v.reshape(-1) if k == "a" else float(v) if k == "n" else v
                     for v, k in zip(current, kinds)])

        return launch

    def _transposed_launcher(self, args: Sequence[Any], shape: tuple, out: np.ndarray | None
                             ) -> Callable | None:
        """The launcher of an all-Fortran-order call: the C-order launch on the operands'
        transposes (same elements, same loop), whose result transposed back is
        Fortran-ordered like the operands."""
        ndim = len(shape)
        inner = self.launcher(transpose_all(args, ndim), None if out is None else out.T)
        if inner is None:
            return None

        def launch(*current: Any, out: np.ndarray | None = None) -> np.ndarray:
            if out is None:
                return inner(*transpose_all(current, ndim)).T
            inner(*transpose_all(current, ndim), out=out.T)
            return out

        return launch

    def _source(self, key: tuple) -> str:
        return elementwise_source(self.nin, self.nout, key)

    def _signature(self, dtype: np.dtype, key: tuple) -> tuple:
        layout, mask, flags = key[:3]
        alias = key[3] if layout == "flat" and len(key) > 3 else (-1,) * self.nout
        ndim, order = {"flat": (1, "C"), "grid": (2, "A"), "rows": (2, "C"),
                       "planes": (3, "C")}[layout]
        t = jit.numba().types

        def array(i: int) -> Any:
            if layout in ("rows", "planes") and key[3][i] != "f":
                return jit.array_type(dtype, 1, "C", readonly=True)
            return jit.array_type(dtype, ndim, order, readonly=i not in alias)

        inputs = [array(i) if mask >> i & 1 else t.boolean if flags >> i & 1 else t.float64
                  for i in range(self.nin)]
        outputs = [jit.array_type(dtype, ndim, order)] * alias.count(-1)
        return (*inputs, *outputs)

    def _run(self, args: Sequence[Any], out: Any, parallel: bool | None) -> Any:
        if len(args) != self.nin:
            raise TypeError(f"{self.name} takes {self.nin} inputs, got {len(args)}")
        values = list(args)
        arrays: list[np.ndarray] = []
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
        if not flat and out is None and _strided_alike(arrays):
            # Operands of one shape and dtype, some strided (a dense layer's input
            # gradient, Fortran-ordered, reshaped to a convolution's output): contiguous
            # copies cost less than the general loop's setup (relu's gradient on 32 x 64
            # x 2 x 2 that way: 48 -> 15 us).
            values = [np.ascontiguousarray(v) if mask >> i & 1 else v
                      for i, v in enumerate(values)]
            arrays = [v for i, v in enumerate(values) if mask >> i & 1]
            flat = True
        if flat and arrays and arrays[0].dtype in _COMPILED:
            dtype, shape = arrays[0].dtype, arrays[0].shape
        else:
            dtype = self._common_dtype(arrays, arrays or values)
            shape = self._shape(arrays)
            if fortran_call(arrays, shape, out):
                # Fortran-ordered operands (a GEMM's output laid out by columns): the
                # C-order loops over their transposes, and a result ordered like them.
                outs = None if out is None else [o.T for o in _as_list(out)]
                result = self._run(transpose_all(values, len(shape)),
                                   outs if outs is None or self.nout > 1 else outs[0],
                                   parallel)
                if out is not None:
                    given = _as_list(out)
                    return given[0] if self.nout == 1 else tuple(given)
                return result.T if self.nout == 1 else tuple(r.T for r in result)
        outs = self._outputs(out, shape, dtype, arrays)
        size = math.prod(shape)
        if size:
            if parallel is None:
                parallel = size >= self.parallel_threshold
            # Number scalars go in as Python numbers (cheap to pass) and the driver casts
            # them to the kernel's dtype, as NumPy's weak scalars; bools stay flags.
            if flat and all(o.flags.c_contiguous for o in outs):
                # An output that is one of the inputs (an optimizer's parameter) gets a
                # loop of its own that stores through that input.
                alias = tuple(next((i for i, a in enumerate(args) if a is o), -1)
                              for o in outs) if out is not None else ()
                if alias.count(-1) == len(alias):
                    self._flat(values, outs, dtype, (mask, flags), parallel)
                else:
                    self._flat(values, [o for o, i in zip(outs, alias) if i < 0], dtype,
                               (mask, flags, alias), parallel)
            else:
                self._grid(values, outs, shape, dtype, (mask, flags), parallel)
        return outs[0] if self.nout == 1 else tuple(outs)

    def _shape(self, arrays: list) -> tuple:
        """The broadcast shape of `arrays`, or a KernelError."""
        try:
            return np.broadcast_shapes(*(a.shape for a in arrays))
        except ValueError:
            raise KernelError(self.name, arrays, "shapes cannot be broadcast together") from None

    def _outputs(self, out: Any, shape: tuple, dtype: np.dtype, arrays: list) -> list:
        if out is None:
            return [np.empty(shape, dtype) for _ in range(self.nout)]
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != self.nout:
            raise KernelError(self.name, arrays, f"out= needs {self.nout} arrays, got {len(outs)}")
        for o in outs:
            if type(o) is not np.ndarray or o.shape != shape or o.dtype != dtype:
                raise KernelError(self.name, [*arrays, o],
                             f"out= must be a {dtype} array of shape {shape}")
            if not o.flags.writeable:
                raise KernelError(self.name, [*arrays, o], "out= is read-only")
        return outs

    def _flat(self, values: list, outs: list, dtype: np.dtype, masks: tuple[Any, ...],
              parallel: bool) -> None:
        mask = masks[0]
        for i, v in enumerate(values):
            if mask >> i & 1 and v.ndim != 1:
                values[i] = v.ravel()
        key = ("flat", *masks)
        driver = self._drivers.get((dtype, key, parallel))
        if driver is None:
            driver = self._driver(dtype, key, parallel)
            if mask == (1 << self.nin) - 1 and len(masks) == 2:
                (self._parallel_fast if parallel else self._serial_fast)[dtype] = driver
        driver(*values, *[o if o.ndim == 1 else o.ravel() for o in outs])

    def _grid(self, values: list, outs: list, shape: tuple, dtype: np.dtype,
              masks: tuple[int, ...], parallel: bool) -> None:
        # Broadcast views as (rows, last axis): zero strides are fine for Numba's 'A'
        # arrays; reshape copies only for strides it cannot merge.
        found = _contiguous_layout(values, masks[0], shape, dtype)
        if found is not None:
            layout, grid, kinds = found
            key: tuple[Any, ...] = (layout, *masks, kinds)
            for i, form in enumerate(_forms(kinds, grid)):
                if form is not None:
                    values[i] = values[i].reshape(form)
        else:
            grid = (math.prod(shape[:-1]), shape[-1]) if shape else (1, 1)
            key = ("grid", *masks)
            for i in range(self.nin):
                if masks[0] >> i & 1:
                    values[i] = np.broadcast_to(values[i], shape).reshape(grid)
        targets = [o.reshape(grid) if o.flags.c_contiguous else np.empty(grid, dtype)
                   for o in outs]
        self._driver(dtype, key, parallel)(*values, *targets)
        for o, t in zip(outs, targets):
            if not o.flags.c_contiguous:
                o[...] = t.reshape(shape)


def _strided_alike(arrays: list[np.ndarray]) -> bool:
    """Whether the arrays share one shape and a compiled dtype, some are neither C- nor
    (all of them) Fortran-contiguous."""
    if not arrays or arrays[0].dtype not in _COMPILED:
        return False
    first = arrays[0]
    return (all(a.shape == first.shape and a.dtype is first.dtype for a in arrays)
            and not all(a.flags.f_contiguous for a in arrays))


def _memory_order(a: np.ndarray, b: np.ndarray) -> Literal["C", "F"] | None:
    """"C" or "F" when both arrays are contiguous in that order (ravel in it is then a
    view, element for element alike), else None."""
    if a.flags.c_contiguous and b.flags.c_contiguous:
        return "C"
    if a.flags.f_contiguous and b.flags.f_contiguous:
        return "F"
    return None


def _as_list(out: Any) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def fortran_call(arrays: list, shape: tuple, out: Any) -> bool:
    """Whether a call is best run on its operands' transposes: every array operand (and
    output) is Fortran-contiguous, and some operand is not C-contiguous too (an
    operand broadcast along leading axes, a bias, is both once padded)."""
    if len(shape) < 2 or all(a.flags.c_contiguous for a in arrays):
        return False
    if not all(a.flags.f_contiguous for a in arrays):
        return False
    return out is None or all(type(o) is np.ndarray and o.flags.f_contiguous
                              and o.shape == shape for o in _as_list(out))


def transpose_all(values: Any, ndim: int) -> list:
    """Each array operand padded to `ndim` axes and transposed (scalars as they are)."""
    return [v.reshape((1,) * (ndim - v.ndim) + v.shape).T if type(v) is np.ndarray else v
            for v in values]


def _contiguous_layout(values: list, mask: int, shape: tuple, dtype: np.dtype
                       ) -> tuple[str, tuple, str] | None:
    """(layout, grid, kinds) of a contiguous loop over broadcast operands: "rows" over
    (rows, last axis) or "planes" over (outer, middle, inner); None when neither fits
    and the strided (rows, last axis) loop must take the call."""
    kinds = _row_kinds(values, mask, shape, dtype)
    if kinds is not None:
        return "rows", (math.prod(shape[:-1]), shape[-1]), kinds
    planes = _plane_kinds(values, mask, shape, dtype)
    return None if planes is None else ("planes", *planes)


def _forms(kinds: str, grid: tuple) -> list:
    """Per input, the shape a contiguous loop reads it as: the grid (whole), 1-D (a row,
    a column, one value), or None (not an array)."""
    return [None if k == "-" else grid if k == "f" else (-1,) for k in kinds]


def _padded_shapes(values: list, mask: int, shape: tuple, dtype: np.dtype) -> list | None:
    """Per input, its shape left-padded to `shape`'s length (None: not an array), or
    None when some array operand is strided or of another dtype (no contiguous loop)."""
    padded: list[tuple[int, ...] | None] = []
    for i, v in enumerate(values):
        if not mask >> i & 1:
            padded.append(None)
        elif v.dtype != dtype or not v.flags.c_contiguous:
            return None
        else:
            padded.append((1,) * (len(shape) - v.ndim) + v.shape)
    return padded


def _row_kinds(values: list, mask: int, shape: tuple, dtype: np.dtype) -> str | None:
    """Per input, how a contiguous array operand broadcasts over (rows, last axis) of
    `shape`: "f" whole, "r" one row shared by all rows, "c" one value per row, "s" one
    value ("-": not an array). None when some operand fits none of these."""
    padded = _padded_shapes(values, mask, shape, dtype) if shape else None
    if padded is None:
        return None
    kinds = []
    for s in padded:
        if s is None:
            kinds.append("-")
        elif s == shape:
            kinds.append("f")
        elif math.prod(s) == 1:
            kinds.append("s")
        elif s[-1] == shape[-1] and all(d == 1 for d in s[:-1]):
            kinds.append("r")
        elif s[-1] == 1 and s[:-1] == shape[:-1]:
            kinds.append("c")
        else:
            return None
    return "".join(kinds)


def _plane_kinds(values: list, mask: int, shape: tuple, dtype: np.dtype
                 ) -> tuple[tuple, str] | None:
    """`shape` as (outer, middle, inner) planes when every contiguous array operand is
    whole ("f"), one value ("s"), or varies along the middle axes only ("m"): a
    per-channel bias or scale over NCHW, say. None otherwise."""
    padded = _padded_shapes(values, mask, shape, dtype)
    if padded is None:
        return None
    kinds, span = [], None
    for s in padded:
        if s is None or s == shape or math.prod(s) == 1:
            kinds.append("-" if s is None else "f" if s == shape else "s")
            continue
        varying = [d for d, n in enumerate(s) if n != 1]
        lo, hi = varying[0], varying[-1] + 1
        if s[lo:hi] != shape[lo:hi] or (span is not None and span != (lo, hi)):
            return None
        span = (lo, hi)
        kinds.append("m")
    if span is None:
        return None
    lo, hi = span
    grid = (math.prod(shape[:lo]), math.prod(shape[lo:hi]), math.prod(shape[hi:]))
    return grid, "".join(kinds)
