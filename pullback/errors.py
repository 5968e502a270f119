"""The errors layer: the exception types every layer raises, importing nothing.

Every invalid op call, from a backend kernel or from an op's shape rule, raises
`KernelError` naming the op as the public API spells it, the shapes as Python
prints them, and the dtypes: "matmul: (3, 4) and (5, 2): inner dimensions 4
and 5 differ (dtypes float32 and float32)".
"""

from __future__ import annotations

from collections.abc import Sequence
from types import FrameType


def describe(value: object) -> tuple[tuple[int, ...], str]:
    """(shape, dtype name) of an array, a tensor, an abstract value or a scalar."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None:
        return (), type(value).__name__
    return tuple(shape), str(dtype)


class KernelError(ValueError):
    """An op was called with shapes, dtypes or arguments it does not accept."""

    def __init__(self, op: str, operands: Sequence[object], reason: str) -> None:
        self.op = op
        described = [describe(v) for v in operands]
        self.shapes = tuple(s for s, _ in described)
        self.dtypes = tuple(d for _, d in described)
        self.reason = reason
        shapes = " and ".join(str(s) for s in self.shapes)
        dtypes = " and ".join(self.dtypes)
        head = f"{op}: {shapes}: " if described else f"{op}: "
        tail = f" (dtype{'s' if len(self.dtypes) > 1 else ''} {dtypes})" if described else ""
        super().__init__(f"{head}{reason}{tail}")


class KernelIndexError(KernelError, IndexError):
    """An index out of range: a KernelError that is also the IndexError Python's
    sequence protocols (and `except IndexError`) expect, as NumPy and PyTorch raise."""


def index_error(op: str, operands: Sequence[object], reason: str, cause: Exception
                ) -> KernelError:
    """The KernelError for a failed indexing: a KernelIndexError when `cause` is one."""
    cls = KernelIndexError if isinstance(cause, IndexError) else KernelError
    return cls(op, operands, reason)


class TracingError(RuntimeError):
    """A traced value's concrete contents were asked for while `compile` traced a
    function (`float(t)`, `bool(t)`, `t.item()`, `np.asarray(t)`): a plan would bake the
    tracing example's values into every later call, so it is refused, as JAX's
    `ConcretizationTypeError` refuses it. A RuntimeError, not a TypeError, so that no
    `except TypeError` on the way (a shape argument tried as an int) swallows it."""

    def __init__(self, operation: str, value: object, where: str) -> None:
        self.operation = operation
        self.where = where
        shape, dtype = describe(value)
        super().__init__(
            f"{operation} on a traced value ({shape} {dtype}) at {where}: compile traces the "
            "function once and cannot bake a value that changes with the inputs or the "
            "parameters into the plan. Keep the value a tensor (use pb.where instead of a "
            "Python `if`, tensor ops instead of NumPy), or pass it to the plan as an input; "
            "or run this part eagerly")


def user_frame(skip: int = 1) -> str:
    """`file:line` of the innermost frame outside the pullback package: the user's line
    that called into it."""
    import os
    import sys

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame: FrameType | None = sys._getframe(skip)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not os.path.abspath(filename).startswith(package):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"
