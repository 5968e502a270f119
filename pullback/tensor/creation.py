"""Making tensors: `tensor`, `zeros`, `ones`, `full`, `*_like`, `arange`, `randn`, `rand`.

Python floats become float32 unless `dtype` says otherwise; NumPy arrays keep
their dtype; integer and bool data stay so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .eager import Tensor, _wrap

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)

_SUPPORTED = "float32, float64, int32, int64, bool (and other NumPy integer dtypes)"


def _dtype(dtype: Any) -> np.dtype | None:
    if dtype is None:
        return None
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"tensor: unknown dtype {dtype!r}; supported: {_SUPPORTED}") from None
    if resolved.kind not in "fiub" or (resolved.kind == "f" and resolved.itemsize < 4):
        raise TypeError(f"tensor: dtype {resolved} is not supported; supported: {_SUPPORTED}")
    return resolved


def as_array(data: Any, dtype: Any = None) -> np.ndarray:
    """Data as an array: Python floats to float32, arrays keep their dtype."""
    dtype = _dtype(dtype)
    if isinstance(data, Tensor):
        data = data._data
    if isinstance(data, np.ndarray):
        return data if dtype is None or data.dtype == dtype else data.astype(dtype)
    array = np.asarray(data)
    if array.dtype.kind == "O" or array.dtype.kind not in "fiub":
        raise TypeError(f"tensor: cannot make a tensor from {type(data).__name__} data")
    if dtype is None and array.dtype.kind == "f" and not isinstance(data, np.generic):
        dtype = float32  # Python floats are float32 by default, as in PyTorch
    return array.astype(dtype) if dtype is not None and array.dtype != dtype else array


def tensor(data: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor from nested lists, scalars, NumPy arrays or another tensor (copied)."""
    array = as_array(data, dtype)
    if isinstance(data, Tensor) and array is data._data:
        array = array.copy()
    return _finish(array, requires_grad)


def _finish(array: np.ndarray, requires_grad: bool) -> Tensor:
    t = _wrap(array, None)
    if requires_grad:
        t.requires_grad = True
    return t


def _shape(shape: tuple) -> tuple:
    if len(shape) == 1 and not isinstance(shape[0], int):
        shape = tuple(shape[0])
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
        raise ValueError(f"expected a shape of non-negative ints, got {shape}")
    return tuple(int(d) for d in shape)


def zeros(*shape: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return _finish(np.zeros(_shape(shape), _dtype(dtype) or float32), requires_grad)


def ones(*shape: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return _finish(np.ones(_shape(shape), _dtype(dtype) or float32), requires_grad)


def full(shape: Any, value: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = _dtype(dtype) or (float32 if isinstance(value, float) else np.asarray(value).dtype)
    return _finish(np.full(_shape(shape), value, dtype), requires_grad)


def zeros_like(t: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return _finish(np.zeros(np.shape(t), _dtype(dtype) or _dtype_of(t)), requires_grad)


def ones_like(t: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    return _finish(np.ones(np.shape(t), _dtype(dtype) or _dtype_of(t)), requires_grad)


def _dtype_of(t: Any) -> np.dtype:
    return t.dtype if hasattr(t, "dtype") else float32


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None,
           requires_grad: bool = False) -> Tensor:
    """As NumPy's arange; integer arguments give int64, any float gives float32."""
    if stop is None:
        start, stop = 0, start
    floats = any(isinstance(v, float) for v in (start, stop, step))
    dtype = _dtype(dtype) or (float32 if floats else int64)
    return _finish(np.arange(start, stop, step, dtype=dtype), requires_grad)


_global_rng: list[np.random.Generator] = [np.random.default_rng()]


def manual_seed(seed: int) -> None:
    """Seed the generator that `randn` and `rand` use when given no `seed`."""
    _global_rng[0] = np.random.default_rng(seed)


def default_generator() -> np.random.Generator:
    """The generator that `randn`, `rand`, layer initializers and dropout draw from when
    given no seed (a training checkpoint saves it; resuming restores it)."""
    return _global_rng[0]


def set_default_generator(rng: np.random.Generator) -> None:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"set_default_generator: expected a np.random.Generator, got "
                        f"{type(rng).__name__}")
    _global_rng[0] = rng


def _rng(seed: Any) -> np.random.Generator:
    return _global_rng[0] if seed is None else np.random.default_rng(seed)


def randn(*shape: Any, seed: Any = None, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """Standard normal samples; the same `seed` gives the same values."""
    dtype = _dtype(dtype) or float32
    return _finish(_rng(seed).standard_normal(_shape(shape)).astype(dtype), requires_grad)


def rand(*shape: Any, seed: Any = None, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1); the same `seed` gives the same values."""
    dtype = _dtype(dtype) or float32
    return _finish(_rng(seed).random(_shape(shape)).astype(dtype), requires_grad)
