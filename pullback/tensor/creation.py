"""Making tensors: `tensor`, `zeros`, `ones`, `full`, `*_like`, `arange`, and the random
ones `randn`, `rand`, `randint` and `multinomial`.

Python floats become float32 unless `dtype` says otherwise; NumPy arrays keep
their dtype; integer and bool data stay so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .arrays import as_array, bool_, cast, check_dtype, float32, int64, resolve_dtype
from .concrete import check_concrete
from .eager import Tensor, wrap

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from typing_extensions import CapsuleType

    from ..ops.hints import ArrayLike, DTypeLike, Shape, TensorLike


class SupportsDLPack(Protocol):
    """What `from_dlpack` reads: an array of another library (a PyTorch CPU tensor, a
    NumPy array), which exports its memory through `__dlpack__`."""

    def __dlpack__(self, /, *, stream: None = None) -> CapsuleType: ...


def tensor(data: Tensor | ArrayLike, dtype: DTypeLike | None = None, requires_grad: bool = False
           ) -> Tensor:
    """A tensor from nested lists, scalars, NumPy arrays or another tensor; it copies
    the data (as `torch.tensor` does), so later writes to `data` do not reach it."""
    if isinstance(data, Tensor):
        check_concrete(data, "pb.tensor(t)")  # a copy of a traced value would be baked
        data = data._data
    return _finish(as_array(data, dtype, copy=True), requires_grad)


def from_numpy(array: NDArray[Any]) -> Tensor:
    """A tensor sharing memory with the NumPy `array` (as `torch.from_numpy`): writes to
    either show in the other, and while a pending backward needs its values the array
    is read-only. The dtype rules of `tensor` apply."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a np.ndarray, got {type(array).__name__}")
    check_dtype(array.dtype, "from_numpy", "dtype")
    return wrap(array, None)


def from_dlpack(obj: SupportsDLPack) -> Tensor:
    """A tensor sharing memory with another library's array (anything with `__dlpack__`:
    a PyTorch CPU tensor, a NumPy array); the dtype rules of `tensor` apply."""
    try:
        array = np.from_dlpack(obj)
    except (TypeError, AttributeError, BufferError, RuntimeError) as err:
        raise TypeError(f"from_dlpack: cannot read a {type(obj).__name__}: {err}") from None
    check_dtype(array.dtype, "from_dlpack", "dtype")
    return wrap(array, None)


def _finish(array: NDArray[Any], requires_grad: bool) -> Tensor:
    t = wrap(array, None)
    if requires_grad:
        t.requires_grad = True
    return t


def _shape(shape: tuple[int | Sequence[int], ...], op: str) -> Shape:
    """A shape given as ints (`zeros(2, 3)`) or as one sequence (`zeros((2, 3))`)."""
    dims: tuple[Any, ...] = shape  # checked below
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        dims = tuple(shape[0])
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_))
               and d >= 0 for d in dims):
        raise ValueError(f"{op}: expected a shape of non-negative ints, got "
                         f"{tuple(dims)}")
    return tuple(int(d) for d in dims)


def zeros(*shape: int | Sequence[int], dtype: DTypeLike | None = None,
          requires_grad: bool = False) -> Tensor:
    return _finish(np.zeros(_shape(shape, "zeros"), resolve_dtype(dtype, "zeros") or float32),
                   requires_grad)


def ones(*shape: int | Sequence[int], dtype: DTypeLike | None = None,
         requires_grad: bool = False) -> Tensor:
    return _finish(np.ones(_shape(shape, "ones"), resolve_dtype(dtype, "ones") or float32),
                   requires_grad)


def full(shape: int | Sequence[int], value: bool | int | float | Tensor,
         dtype: DTypeLike | None = None, requires_grad: bool = False) -> Tensor:
    """A tensor of `shape` filled with the number `value`; a float fills float32, an int
    int64 and a bool bool unless `dtype` says otherwise (as in PyTorch)."""
    shape = _shape(tuple(shape) if isinstance(shape, (list, tuple)) else (shape,), "full")
    dtype = resolve_dtype(dtype, "full") or _fill_dtype(value)
    fill = value._data if isinstance(value, Tensor) else value
    if dtype.kind in "iu":
        cast(np.asarray(fill), dtype, "full")  # a fill that would wrap is refused
    return _finish(np.full(shape, fill, dtype), requires_grad)


def _fill_dtype(value: bool | int | float | Tensor | NDArray[Any]) -> np.dtype[Any]:
    if isinstance(value, (Tensor, np.ndarray)) and value.ndim == 0:
        check_dtype(value.dtype, "full", "a fill value of dtype")
        return value.dtype  # a 0-d tensor or array fills with its own dtype
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return int64
    if isinstance(value, (float, np.floating)):
        return float32
    raise TypeError(f"full: the fill value must be a bool, int or float, got "
                    f"{type(value).__name__} {value!r}")


def zeros_like(t: TensorLike, dtype: DTypeLike | None = None, requires_grad: bool = False
               ) -> Tensor:
    dtype = resolve_dtype(dtype, "zeros_like") or _dtype_of(t)
    return _finish(np.zeros(np.shape(t), dtype), requires_grad)


def ones_like(t: TensorLike, dtype: DTypeLike | None = None, requires_grad: bool = False
              ) -> Tensor:
    dtype = resolve_dtype(dtype, "ones_like") or _dtype_of(t)
    return _finish(np.ones(np.shape(t), dtype), requires_grad)


def _dtype_of(t: TensorLike) -> np.dtype[Any]:
    dtype: np.dtype[Any] = getattr(t, "dtype", float32)
    return dtype


def arange(start: float, stop: float | None = None, step: float = 1,
           dtype: DTypeLike | None = None, requires_grad: bool = False) -> Tensor:
    """As NumPy's arange; integer arguments give int64, any float gives float32."""
    if stop is None:
        start, stop = 0, start
    bounds = (start, stop, step)
    if not all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
               for v in bounds):
        raise TypeError(f"arange: start, stop and step must be numbers, got {bounds}")
    if step == 0:
        raise ValueError("arange: step must not be zero")
    floats = any(isinstance(v, (float, np.floating)) for v in bounds)
    dtype = resolve_dtype(dtype, "arange") or (float32 if floats else int64)
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


def _rng(seed: int | None) -> np.random.Generator:
    return _global_rng[0] if seed is None else np.random.default_rng(seed)


def randn(*shape: int | Sequence[int], seed: int | None = None, dtype: DTypeLike | None = None,
          requires_grad: bool = False) -> Tensor:
    """Standard normal samples; the same `seed` gives the same values."""
    dtype = resolve_dtype(dtype, "randn") or float32
    return _finish(_rng(seed).standard_normal(_shape(shape, "randn")).astype(dtype), requires_grad)


def rand(*shape: int | Sequence[int], seed: int | None = None, dtype: DTypeLike | None = None,
         requires_grad: bool = False) -> Tensor:
    """Uniform samples in [0, 1); the same `seed` gives the same values."""
    dtype = resolve_dtype(dtype, "rand") or float32
    return _finish(_rng(seed).random(_shape(shape, "rand")).astype(dtype), requires_grad)


def randint(low: int, high: int, shape: int | Sequence[int], seed: int | None = None,
            dtype: DTypeLike | None = None) -> Tensor:
    """Integers drawn uniformly from [low, high), int64 unless `dtype` says otherwise, as
    torch.randint; `shape` an int or a tuple. The same `seed` gives the same values."""
    bounds = (low, high)
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
               for v in bounds):
        raise TypeError(f"randint: low and high must be ints, got {bounds}")
    if low >= high:
        raise ValueError(f"randint: low ({low}) must be below high ({high})")
    dtype = resolve_dtype(dtype, "randint") or int64
    shape = _shape(tuple(shape) if isinstance(shape, (list, tuple)) else (shape,), "randint")
    values = _rng(seed).integers(low, high, shape)
    return _finish(cast(values, dtype, "randint"), False)


def multinomial(probs: TensorLike, n: int, seed: int | None = None, replacement: bool = False
                ) -> Tensor:
    """`n` category indices (int64) drawn from each row of `probs` (a vector, or a matrix
    of rows) with probabilities proportional to its entries, as torch.multinomial: without
    replacement (the default) a category is drawn at most once per row. The same `seed`
    gives the same draws."""
    weights = np.asarray(probs._data if isinstance(probs, Tensor) else probs)
    if weights.ndim not in (1, 2) or weights.dtype.kind not in "fiu":
        raise ValueError(f"multinomial: probs must be a vector or a matrix of numbers, got "
                         f"shape {weights.shape} of {weights.dtype}")
    if not isinstance(n, (int, np.integer)) or isinstance(n, (bool, np.bool_)) or n < 0:
        raise ValueError(f"multinomial: the number of samples must be a non-negative int, "
                         f"got {n!r}")
    rows = weights.reshape(-1, weights.shape[-1]).astype(np.float64)
    if not np.isfinite(rows).all() or (rows < 0).any() or (rows.sum(axis=1) <= 0).any():
        raise ValueError("multinomial: each row of probs must be finite, non-negative and "
                         "have a positive sum")
    if not replacement and n > (rows > 0).sum(axis=1).min():
        raise ValueError(f"multinomial: cannot draw {n} samples without replacement from a "
                         f"row with {(rows > 0).sum(axis=1).min()} categories of nonzero "
                         "probability")
    rng = _rng(seed)
    if replacement:
        # Inverse CDF per row, all rows in one search: row r's CDF is shifted up by r.
        cdf = np.cumsum(rows, axis=1)
        cdf = cdf / cdf[:, -1:] + np.arange(len(rows))[:, None]
        u = rng.random((len(rows), int(n))) + np.arange(len(rows))[:, None]
        drawn = np.searchsorted(cdf.ravel(), u.ravel(), side="right").reshape(u.shape)
        drawn -= np.arange(len(rows))[:, None] * rows.shape[1]
    else:
        # Exponential races (as PyTorch draws without replacement): the n categories with
        # the largest p / E, E ~ Exp(1), are drawn in that order, as successive draws
        # without replacement would give them; a category of probability 0 never is.
        with np.errstate(divide="ignore"):
            keys = rows / rng.exponential(size=rows.shape)
        drawn = np.argsort(-keys, axis=1, kind="stable")[:, :int(n)]
    return _finish(drawn.reshape(weights.shape[:-1] + (int(n),)).astype(np.int64), False)
