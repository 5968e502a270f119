"""Reading a tensor's concrete values, refused while a function is traced.

`float(t)`, `int(t)`, `bool(t)`, `t.item()`, `t.tolist()`, `t.numpy()` and
`np.asarray(t)` hand back values, not tensors: while `compile` traces a function,
a value read so would be baked into the plan. The tracer (in the lowering layer,
above this one) installs a check here for its thread; the check raises
`TracingError` when the tensor is a traced value (computed from the plan's inputs
or parameters). Code of pullback's own that needs the array reads `t._data`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .eager import Tensor

# `check(tensor, operation)`: raises if the tensor's values may not be read now.
ConcreteCheck = Callable[["Tensor", str], None]

# The check of this thread's tracer, None when nothing is traced (one C call per read).
CONCRETE_CHECK: ContextVar[ConcreteCheck | None] = ContextVar(
    "pullback_concrete_check", default=None)


def set_concrete_check(check: ConcreteCheck | None) -> Token[ConcreteCheck | None]:
    """Install `check(tensor, operation)` for this thread; returns a token for `reset`."""
    return CONCRETE_CHECK.set(check)


def reset_concrete_check(token: Token[ConcreteCheck | None]) -> None:
    CONCRETE_CHECK.reset(token)


def check_concrete(tensor: Tensor, operation: str) -> None:
    """Raise (through the installed check) if `tensor`'s values may not be read now."""
    check = CONCRETE_CHECK.get()
    if check is not None:
        check(tensor, operation)
