"""What every kernel shares: the supported dtypes, the parallel threshold, errors,
and the `Kernel` base class that compiles a body per dtype and calling pattern into
serial and parallel loops (jit.py) and keeps them for one-lookup dispatch.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from pullback.errors import KernelError
from pullback.kernels import jit

SUPPORTED_DTYPES: tuple[np.dtype, ...] = (np.dtype(np.float32), np.dtype(np.float64))
_SUPPORTED = "supported: " + ", ".join(d.name for d in SUPPORTED_DTYPES)
# Kernels run their serial loop unless asked (`k.parallel`), or unless the array has
# at least PULLBACK_KERNEL_PARALLEL_THRESHOLD elements. Off by default: in a training
# step Numba's worker threads and OpenBLAS's spinning threads fight over the two
# cores, and a measured MLP step went from 1.0 ms to 8.3 ms (bench/mlp_step.py).
# ThreadedCpuBackend splits large ops over its own pool and runs serial kernels.
PARALLEL_THRESHOLD = int(os.environ.get("PULLBACK_KERNEL_PARALLEL_THRESHOLD", 2**62))


class Kernel:
    """What both kernel kinds share: name, Python body, backward pair, dtype dispatch."""

    if TYPE_CHECKING:  # what each kind of kernel (ElementwiseKernel, RowKernel) defines
        nin: int  # the number of inputs

        def __call__(self, *args: Any, out: Any = None) -> Any: ...

        def serial(self, *args: Any, out: Any = None) -> Any: ...

        def parallel(self, *args: Any, out: Any = None) -> Any: ...

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

    def _abstract(self) -> NoReturn:
        raise TypeError(f"{type(self).__name__} is the abstract base of kernels: declare one "
                        "with @kernel (an ElementwiseKernel or a RowKernel)")

    def _source(self, key: tuple) -> str:
        self._abstract()

    def _signature(self, dtype: np.dtype, key: tuple) -> tuple:
        self._abstract()

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
                module = jit.load_drivers(self.name, self.python, dtype, self._source(key))
                self._modules[(dtype, key)] = module
            driver = module.parallel_loop if parallel else module.serial_loop
            # One explicit signature, inputs read-only and arrays of any alignment, then
            # no more compiling: writable, read-only (pullback's saved arrays) and
            # unaligned arrays all convert to it, where Numba would otherwise compile a
            # specialization for each.
            jit.compile_once(driver, self._signature(dtype, key))
            self._drivers[(dtype, key, parallel)] = driver
        return driver

    def _common_dtype(self, arrays: Sequence[np.ndarray], shown: Sequence[Any]) -> np.dtype:
        """The one supported float dtype of `arrays`, or a KernelError listing the
        supported ones."""
        dtype = arrays[0].dtype if arrays else np.dtype(np.float64)
        for a in arrays:
            if a.dtype != dtype:
                names = " and ".join(sorted({x.dtype.name for x in arrays}))
                raise KernelError(self.name, list(shown), f"mixed dtypes {names}; {_SUPPORTED}")
        if dtype not in SUPPORTED_DTYPES:
            raise KernelError(self.name, list(shown), f"unsupported dtype {dtype}; {_SUPPORTED}")
        return dtype


_COMPILED = frozenset(SUPPORTED_DTYPES)
_INTP = np.dtype(np.intp)


def _is_python_scalar(value: Any) -> bool:
    return type(value) in (float, int, bool)
