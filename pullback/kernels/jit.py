"""Compiling a kernel body for one dtype: precision, generated loop drivers, disk cache.

A kernel body is a scalar (or row) function; what runs is a *driver*, a loop over the
arrays that calls it, generated as Python source per kernel, dtype and calling pattern.
The source is written to a file in the kernel cache folder and imported from there, so
that Numba's `cache=True` (which needs a real source file) keeps the compiled machine
code on disk across runs. The file name carries a hash of the kernel's code, so an
edited kernel gets fresh files instead of stale machine code.

Numba itself is imported on the first compilation only: `import pullback` stays cheap.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import tempfile
import threading
import types
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import numpy as np

# Bump when the generated drivers change shape: old cache files then go unused.
GENERATOR_VERSION = "2"
# Every kernel compiles with NumPy's float semantics (x / 0 is inf, not
# ZeroDivisionError, so divisions stay branch-free and vectorizable) and without the GIL
# (ThreadedCpuBackend runs kernels on its pool threads). Bodies keep IEEE arithmetic,
# no FMA contraction: LLVM contracted gelu_backward's `cdf + x * pdf` in one loop and
# not the other, so serial and parallel results differed where that sum cancels.
JIT_OPTIONS: dict[str, Any] = {"error_model": "numpy", "nogil": True}

_lock = threading.RLock()
_numba: Any = None
_cache_dir: Path | None = None
_closed: dict[Hashable, Any] = {}  # `compiled_once`'s dispatchers, by their makers' keys


def numba() -> Any:
    """The numba module, imported (and our scalar math registered with it) once."""
    global _numba
    if _numba is None:
        with _lock:
            if _numba is None:
                import numba as nb

                from pullback.kernels import numba_math  # noqa: F401 (registers overloads)

                _numba = nb
    return _numba


def cache_dir() -> Path:
    """Where generated drivers (and, beside them, Numba's cache) live:
    $PULLBACK_KERNEL_CACHE, else ~/.cache/pullback/kernels; a temporary folder (no reuse
    across runs) when neither can be written."""
    global _cache_dir
    if _cache_dir is None:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(os.environ.get("PULLBACK_KERNEL_CACHE") or Path(base) / "pullback" / "kernels")
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".probe-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError:
            path = Path(tempfile.mkdtemp(prefix="pullback-kernels-"))
        _cache_dir = path
    return _cache_dir


def in_precision(fn: Callable, dtype: np.dtype) -> Callable:
    """A copy of `fn` whose float literals and float module constants are `dtype`
    scalars: Numba types a Python float as float64, which would silently run a float32
    kernel in float64 at half the SIMD width (C's `0.5f` versus `0.5`)."""
    if dtype == np.float64:
        return fn
    cast = dtype.type
    code = fn.__code__
    consts = tuple(cast(c) if type(c) is float else c for c in code.co_consts)
    scope = dict(fn.__globals__)
    for name in code.co_names:
        if type(scope.get(name)) is float:
            scope[name] = cast(scope[name])
    copy = types.FunctionType(code.replace(co_consts=consts), scope, fn.__name__,
                              fn.__defaults__, fn.__closure__)
    copy.__qualname__ = fn.__qualname__
    copy.__module__ = fn.__module__
    return copy


def rebound(fn: Callable, scope: dict[str, Any]) -> Callable:
    """A copy of `fn` reading its globals from `scope` (its names bound to compiled
    callees or intrinsics, say), its name, qualified name and module kept, so that
    Numba's disk cache files it as `fn`."""
    copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    copy.__qualname__, copy.__module__ = fn.__qualname__, fn.__module__
    return copy


def item_pointer(context: Any, builder: Any, array_type: Any, array: Any, index: Any) -> Any:
    """In a Numba intrinsic's code generation: the address of a 1-D array's element
    `index` (an LLVM pointer to its scalar type)."""
    from numba.core import cgutils

    structure = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, structure, [index])


def depending_on(fn: Callable, *modules: types.ModuleType) -> Callable:
    """fn (a copy made by `rebound`, renamed in place) named after the files of
    `modules` as well. Numba's disk cache keys a kernel by its own file alone: one that
    compiles in intrinsics or bodies from other files (pullback.kernels.tiles' register
    tiles) would load stale machine code after an edit or an upgrade there; renamed by
    their stamps, it compiles afresh instead."""
    stamps = "\n".join(_stamp(module) for module in modules)
    fn.__qualname__ = f"{fn.__qualname__}_{hashlib.sha256(stamps.encode()).hexdigest()[:12]}"
    return fn


def _file_stamp(path: str) -> str:
    try:
        info = os.stat(path)
    except OSError:
        return ""
    return f"{path}:{info.st_mtime_ns}:{info.st_size}"


# The files whose code ends up in every compiled kernel (the compiled scalar math) or
# shapes it: an edit to any of them must not load stale machine code.
_HERE = Path(__file__).parent
_MACHINERY = [_file_stamp(str(_HERE / name))
              for name in ("numba_math.py", "drivers.py", "jit.py", "scalar_math.py")]


def _stamp(obj: Any) -> str:
    # A source file's identity as Numba's own cache sees it: path, mtime and size.
    try:
        path = obj.__file__ if isinstance(obj, types.ModuleType) else obj.__code__.co_filename
    except AttributeError:
        return ""
    return _file_stamp(path) if isinstance(path, str) else ""


def fingerprint(fn: Callable) -> str:
    """A hash of what a kernel's compiled code depends on: its bytecode and constants,
    and the files of the function and of the functions and modules it names."""
    code = fn.__code__
    parts = [GENERATOR_VERSION, *_MACHINERY, fn.__module__, fn.__qualname__,
             code.co_code.hex(), repr(code.co_consts), repr(code.co_names), _stamp(fn)]
    for name in code.co_names:
        value = fn.__globals__.get(name)
        if isinstance(value, (types.ModuleType, types.FunctionType)):
            parts.append(_stamp(value))
        elif isinstance(value, (int, float, str, tuple)):
            parts.append(f"{name}={value!r}")
        elif value is not None and hasattr(value, "py_func"):  # a Numba dispatcher it calls
            parts.append(_stamp(value.py_func))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def array_type(dtype: np.dtype, ndim: int, layout: str, readonly: bool = False) -> Any:
    """The Numba type of a driver's array parameter. Declared unaligned, which costs
    nothing on x86 (unaligned vector loads are as fast) and admits every array."""
    nb = numba()
    return nb.types.Array(nb.from_dtype(dtype), ndim, layout, readonly=readonly, aligned=False)


def load_drivers(kernel_name: str, fn: Callable, dtype: np.dtype, source: str) -> Any:
    """Import generated driver `source` (from a file in the cache folder) with globals
    `fn`, the kernel body compiled for `dtype`, and `cast`, dtype's scalar type; returns
    the module, its loops as Numba dispatchers `serial_loop` and `parallel_loop`. The
    body is inlined into the loops in Numba's IR: LLVM declines to inline a large
    elementwise body (gelu's), and a call left in the element loop stops it
    vectorizing; a row body called per row cost a call with its rows' array structs
    each time (GPT's layer norm backward on (2048, 128): 0.38 ms a call so, 0.24
    inlined; softmax's backward on rows of 32-128 twice as long), for about the same
    compile time."""
    nb = numba()
    digest = hashlib.sha256(f"{fingerprint(fn)}\n{source}".encode()).hexdigest()[:20]
    safe = re.sub(r"\W", "_", kernel_name)
    module_name = f"_pullback_kernel_{safe}_{dtype.name}_{digest}"
    with _lock:
        # Any: a generated module's attributes (its loops, set below) are its source's.
        module: Any = sys.modules.get(module_name)
        if module is not None:
            return module
        path = cache_dir() / f"{module_name}.py"
        text = f"# Generated by pullback.kernels for {kernel_name} ({dtype.name}).\n{source}"
        if not path.exists() or path.read_text() != text:
            # Write then rename: another process may be importing the same file.
            temp = path.with_suffix(f".{os.getpid()}.tmp")
            temp.write_text(text)
            os.replace(temp, path)
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load the generated kernel module {path}")
        module = importlib.util.module_from_spec(spec)
        # Numba rebuilds a cached function's environment by importing its module by name.
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        body = in_precision(fn, dtype)
        module.fn = nb.njit(inline="always", **JIT_OPTIONS)(body)
        module.cast = dtype.type
        # Dispatchers compile on their first call, from the disk cache when it is there.
        module.serial_loop = nb.njit(cache=True, **JIT_OPTIONS)(module.serial)
        module.parallel_loop = nb.njit(cache=True, parallel=True, **JIT_OPTIONS)(
            module.parallel)
        return module


def compile_once(driver: Any, signature: tuple) -> None:
    """Compile `driver` for `signature`, then forbid it compiling more. Kernels whose
    bodies compile to the same code (generated fused chains that differ only in their
    variables' names) share one module and so its dispatchers: one lock for all of them
    keeps a second thread from compiling a dispatcher that the first has just closed
    ("compilation disabled"). Numba compiles one function at a time anyway."""
    with _lock:
        if signature not in driver.overloads:
            driver.compile(signature)
        driver.disable_compile()


def compiled_once(key: Hashable, make: Callable[..., tuple[Callable, tuple]], *args: Any,
                  **options: Any) -> Any:
    """The dispatcher stored under `key` (unique across modules: a body function and a
    dtype), made on its first use: `make(*args)` gives a Python body and the one
    signature it is compiled for (a module-level `make`: callers on a hot path build no
    closure per call), with Numba's disk cache and JIT_OPTIONS (`options` added or
    overriding), after which the dispatcher compiles nothing more: a call with other
    types raises instead of compiling behind the caller's back. Made under one lock
    (`make` may register helpers or read globals), and once per process."""
    found = _closed.get(key)
    if found is None:
        with _lock:
            found = _closed.get(key)
            if found is None:
                body, signature = make(*args)
                found = numba().njit(cache=True, **{**JIT_OPTIONS, **options})(body)
                found.compile(signature)
                found.disable_compile()
                _closed[key] = found
    return found
