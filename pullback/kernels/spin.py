"""Waiting for another thread on a flag, without the GIL and, for a while, without the
operating system: for pullback.backend.split, whose parts are short (a few hundred
microseconds) next to what waking a sleeping thread costs here (tens of
microseconds each way: ResNet-20's training step took 5% longer so).

`wait_for` polls one int64 of a flags array until it holds a value, for a bounded
number of polls, and says whether it did; `publish_then_wait` first stores a value
there, after the GIL is released. Each poll runs x86's `pause` (a spin loop's
hint), and every YIELD_EVERY polls the thread offers its core to any other thread
ready to run there (`sched_yield`), so that polling never holds a core another thread
of the process (a Numba parallel loop's) needs. `claim` swaps a flag from one value to
another if it still holds the first, atomically, and says whether it did. Compiled,
both run with the GIL released, the flag read by an atomic acquire load (a plain load
would be read once and hoisted out of the loop) and swapped by LLVM's cmpxchg; the
plain-Python bodies are their oracle. Python code writes the flags with ordinary NumPy
stores, under the GIL.
"""

from __future__ import annotations

import os
import platform
from typing import Any

import numpy as np

from pullback.kernels import jit

YIELD_EVERY = 1024  # polls: about 25 us here


def wait_for(flags, index, value, polls):
    """Whether flags[index] == value within `polls` polls."""
    for poll in range(polls):
        if atomic_load(flags, index) == value:
            return True
        pause()
        if poll % YIELD_EVERY == YIELD_EVERY - 1:
            yield_core()
    return False


def publish_then_wait(flags, index, value, wanted, polls):
    """flags[index] = value, then whether flags[index] == wanted within `polls` polls
    (`wait_for`). Compiled, the store is made with the GIL already released: a thread
    that sees it and goes on to take the GIL finds it free, instead of sleeping until
    the storing thread lets it go."""
    atomic_store(flags, index, value)
    return wait_for(flags, index, wanted, polls)


def claim(flags, index, expected, new):
    """flags[index] = new if it holds `expected` (atomically); whether it did."""
    return compare_and_swap(flags, index, expected, new)


def atomic_load(flags, index):
    """flags[index] (compiled: an atomic acquire load)."""
    return flags[index]


def atomic_store(flags, index, value):
    """flags[index] = value (compiled: an atomic release store)."""
    flags[index] = value


def pause():
    """Nothing (compiled on x86: the `pause` instruction)."""


def yield_core():
    """Offer this thread's core to another thread (compiled: POSIX's sched_yield)."""


def compare_and_swap(flags, index, expected, new):
    """Python's version (the GIL makes it atomic for Python callers)."""
    if flags[index] == expected:
        flags[index] = new
        return True
    return False


def compiled(body: Any) -> Any:
    """`wait_for`, `publish_then_wait` or `claim` compiled (nogil, cached on disk), once
    per process."""
    return jit.compiled_once(("spin", body), _make, body)


def _make(body: Any) -> tuple[Any, tuple]:
    nb = jit.numba()
    scope = dict(body.__globals__, atomic_load=_atomic_load(), atomic_store=_atomic_store(),
                 pause=_hint("pause"), yield_core=_hint("yield"),
                 compare_and_swap=_compare_and_swap())
    if body is publish_then_wait:
        scope["wait_for"] = compiled(wait_for)
    flags = jit.array_type(np.dtype(np.int64), 1, "C")
    values = (nb.int64,) * (body.__code__.co_argcount - 2)
    return jit.rebound(body, scope), (flags, nb.intp, *values)


def _atomic_load() -> Any:
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def typer(typingctx, flags, index):
        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            at = cgutils.get_item_pointer(context, builder, signature.args[0], ary, [args[1]])
            return builder.load_atomic(at, "acquire", 8)

        return types.int64(flags, types.intp), codegen

    return intrinsic(typer)


def _atomic_store() -> Any:
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def typer(typingctx, flags, index, value):
        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            at = cgutils.get_item_pointer(context, builder, signature.args[0], ary, [args[1]])
            builder.store_atomic(args[2], at, "release", 8)
            return context.get_dummy_value()

        return types.void(flags, types.intp, types.int64), codegen

    return intrinsic(typer)


def _compare_and_swap() -> Any:
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def typer(typingctx, flags, index, expected, new):
        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            at = cgutils.get_item_pointer(context, builder, signature.args[0], ary, [args[1]])
            swapped = builder.cmpxchg(at, args[2], args[3], "seq_cst", "seq_cst")
            return builder.extract_value(swapped, 1)

        return types.boolean(flags, types.intp, types.int64, types.int64), codegen

    return intrinsic(typer)


def _hint(kind: str) -> Any:
    """`pause` (x86's llvm.x86.sse2.pause) or `yield` (sched_yield, where POSIX has it)
    as an intrinsic; nothing elsewhere."""
    from llvmlite import ir  # type: ignore[import-untyped]  # llvmlite ships no type information
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    if kind == "pause":
        x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
        name, ret = ("llvm.x86.sse2.pause", ir.VoidType()) if x86 else (None, None)
    else:
        name, ret = ("sched_yield", ir.IntType(32)) if os.name == "posix" else (None, None)

    def typer(typingctx):
        def codegen(context, builder, signature, args):
            if name is not None:
                builder.call(cgutils.get_or_insert_function(
                    builder.module, ir.FunctionType(ret, []), name), [])
            return context.get_dummy_value()

        return types.void(), codegen

    return intrinsic(typer)
