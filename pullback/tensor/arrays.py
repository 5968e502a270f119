"""Data to arrays: the dtype rules every tensor source passes (Python floats become
float32, arrays keep their dtype, unsupported dtypes are refused). Knows nothing of
`Tensor`, so both eager.py and creation.py can build on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from ..ops.hints import ArrayLike, DTypeLike

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)

_SUPPORTED = "float32, float64, int32, int64, bool (and other NumPy integer dtypes)"


def resolve_dtype(dtype: DTypeLike | None, op: str = "tensor") -> np.dtype[Any] | None:
    """`dtype` as a NumPy dtype (None stays None), refused when no op computes with it."""
    if dtype is None:
        return None
    try:
        resolved: np.dtype[Any] = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{op}: unknown dtype {dtype!r}; supported: {_SUPPORTED}") from None
    check_dtype(resolved, op, "dtype")
    return resolved


def check_dtype(dtype: np.dtype[Any], op: str, what: str) -> None:
    """Refuse what no op computes with: complex, object, string, datetime, structured
    data, and floats other than float32 and float64 (float16, longdouble)."""
    if dtype.kind in "iub" or dtype in (float32, float64):
        return
    raise TypeError(f"{op}: {what} {dtype} is not supported; supported: {_SUPPORTED}")


def as_array(data: ArrayLike, dtype: DTypeLike | None = None, *, copy: bool = False,
             op: str = "tensor") -> NDArray[Any]:
    """Data as an array: Python floats to float32, arrays keep their dtype; every source
    passes the same dtype check. `copy` makes sure the result shares no memory with
    `data`. A tensor is unwrapped by the caller (this module knows no `Tensor`)."""
    dtype = resolve_dtype(dtype, op)
    if isinstance(data, np.ndarray):
        array, fresh = data, False
    else:
        try:
            array = np.asarray(data)
        except (ValueError, TypeError, OverflowError) as err:
            raise TypeError(f"{op}: cannot make a tensor from {type(data).__name__} data: "
                            f"{err}") from None
        # Lists and Python scalars make a fresh array; other objects may lend theirs.
        fresh = isinstance(data, (list, tuple, int, float, bool, np.generic))
        if array.dtype == np.uint64 and fresh and not isinstance(data, np.generic):
            # Python ints: NumPy picks uint64 for values past int64's range.
            raise OverflowError(f"{op}: integer data out of range for int64 (max "
                                f"{np.iinfo(np.int64).max})")
        if dtype is None and array.dtype.kind == "f" and not isinstance(data, np.generic):
            dtype = float32  # Python floats are float32 by default, as in PyTorch
    check_dtype(array.dtype, op, f"{type(data).__name__} data of dtype")
    if dtype is not None and array.dtype != dtype:
        return cast(array, dtype, op)
    return array.copy() if copy and not fresh else array


def cast(array: NDArray[Any], dtype: np.dtype[Any], op: str) -> NDArray[Any]:
    """`array.astype(dtype)`, refusing integer results that would wrap around."""
    if dtype.kind in "iu" and array.size and not np.can_cast(array.dtype, dtype):
        info = np.iinfo(dtype)
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise ValueError(f"{op}: cannot convert non-finite {array.dtype} values to {dtype}")
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            raise OverflowError(f"{op}: values from {low} to {high} are out of range for "
                                f"{dtype} [{info.min}, {info.max}]")
    return array.astype(dtype)
