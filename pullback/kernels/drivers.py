"""Source text of the loops that run a kernel body over arrays.

Each driver is written out for one calling pattern (which arguments are arrays, how
many outputs), so the body call inside the loop is a plain call that Numba inlines and
LLVM vectorizes; jit.py turns the text into cached machine code. Every module
defines `serial` and `parallel` (the same loop over `prange`); the body is global `fn`.
"""

from __future__ import annotations

from collections.abc import Sequence

_HEADER = "from numba import prange\n"


def _store(call: str, targets: list[str], indent: str) -> str:
    if len(targets) == 1:
        return f"{indent}{targets[0]} = {call}\n"
    names = [f"v{j}" for j in range(len(targets))]
    lines = [f"{indent}{', '.join(names)} = {call}\n"]
    lines += [f"{indent}{t} = {n}\n" for t, n in zip(targets, names)]
    return "".join(lines)


def elementwise_source(nin: int, nout: int, pattern: tuple) -> str:
    """Drivers for an elementwise body of `nin` inputs and `nout` outputs. `pattern` is
    (layout, arrays, flags, ...): layout "flat" for 1-D contiguous arrays, "grid" for
    2-D (rows, last axis) broadcast views, "rows" for contiguous operands broadcast
    by rows or columns, or "planes" for ones broadcast over outer and inner axes (a
    per-channel bias); for the last two a fourth entry gives one letter per input. Bit i of `arrays`
    says input i is an array, bit i of `flags` that it is a bool. Other scalars arrive
    as Python numbers and are cast with global `cast` (the kernel dtype's type) first.
    For flat loops a fourth entry names per output the input it overwrites (-1:
    none): such an output is no parameter of its own and is stored through that
    input, so LLVM sees one array where two aliased ones would fail its overlap check
    and leave the loop scalar."""
    layout, mask, flags = pattern[:3]
    alias = pattern[3] if layout == "flat" and len(pattern) > 3 else (-1,) * nout
    targets = [f"o{j}" if alias[j] < 0 else f"a{alias[j]}" for j in range(nout)]
    outputs = [t for t in targets if t.startswith("o")]
    params = ", ".join([f"a{i}" for i in range(nin)] + outputs)
    index = {"flat": "i", "planes": "p, r, c"}.get(layout, "r, c")
    if layout == "planes":
        # (outer, middle, inner) planes over contiguous operands read whole ("f"), per
        # middle index ("m": a per-channel bias over NCHW) or as one value ("s").
        pick = {"f": "p, r, c", "m": "r", "s": "0"}
        args = ", ".join(f"a{i}[{pick[pattern[3][i]]}]" if mask >> i & 1 else f"a{i}"
                         for i in range(nin))
    elif layout == "rows":
        # (rows, last axis) over contiguous operands, each read whole ("f"), as one row
        # shared by every row ("r"), one value per row ("c") or one value ("s"): plain
        # indexing that LLVM vectorizes, where broadcast strides would not be.
        pick = {"f": "r, c", "r": "c", "c": "r", "s": "0"}
        args = ", ".join(f"a{i}[{pick[pattern[3][i]]}]" if mask >> i & 1 else f"a{i}"
                         for i in range(nin))
    else:
        args = ", ".join(f"a{i}[{index}]" if mask >> i & 1 else f"a{i}" for i in range(nin))
    casts = "".join(f"    a{i} = cast(a{i})\n" for i in range(nin)
                    if not (mask | flags) >> i & 1)
    # The layout named in the text: "rows" and "grid" loops can read alike, but their
    # signatures differ, so they must not share a module (and its compiled loops).
    text = [_HEADER, f"# {layout} layout\n"]
    for name, loop in (("serial", "range"), ("parallel", "prange")):
        text += [f"\n\ndef {name}({params}):\n", casts]
        if layout == "flat":
            text += [f"    for i in {loop}({targets[0]}.shape[0]):\n",
                     _store(f"fn({args})", [f"{o}[{index}]" for o in targets], " " * 8)]
        elif layout == "planes":
            text += [f"    for p in {loop}(o0.shape[0]):\n",
                     "        for r in range(o0.shape[1]):\n",
                     "            for c in range(o0.shape[2]):\n",
                     _store(f"fn({args})", [f"{o}[{index}]" for o in outputs], " " * 16)]
        else:
            text += [f"    for r in {loop}(o0.shape[0]):\n",
                     "        for c in range(o0.shape[1]):\n",
                     _store(f"fn({args})", [f"{o}[{index}]" for o in outputs], " " * 12)]
    return "".join(text)


def rows_source(inputs: Sequence[str], outputs: Sequence[str]) -> str:
    """Drivers for a row body: parameters are the row count, the inputs (rows as
    (R, D), values and indices as (R,), shared arrays whole, scalars as Python numbers
    cast with global `cast`), then the outputs as core.RowKernel orders them (rows
    (R, D), sums (chunks, D), values (R,)). Sums get one accumulator row per chunk of
    rows, so threads never share one."""
    rows = [f"o{j}" for j, kind in enumerate(outputs) if kind == "row"]
    sums = [f"o{j}" for j, kind in enumerate(outputs) if kind == "sum"]
    values = [f"o{j}" for j, kind in enumerate(outputs) if kind == "value"]
    params = ", ".join(["n_rows", *[f"a{i}" for i in range(len(inputs))], *rows, *sums, *values])
    args = [f"a{i}[r]" if kind in ("row", "value", "index") else f"a{i}"
            for i, kind in enumerate(inputs)]

    def body(sum_row: str, indent: str) -> str:
        passed = args + [f"{o}[r]" for o in rows] + [f"{o}[{sum_row}]" for o in sums]
        call = f"fn({', '.join(passed)})"
        if values:
            return _store(call, [f"{o}[r]" for o in values], indent)
        return f"{indent}{call}\n"

    casts = "".join(f"    a{i} = cast(a{i})\n" for i, kind in enumerate(inputs)
                    if kind == "scalar")
    text = [_HEADER, f"\n\ndef serial({params}):\n", casts, "    for r in range(n_rows):\n",
            body("0", " " * 8), f"\n\ndef parallel({params}):\n", casts]
    if sums:
        # Contiguous chunks of rows, one per accumulator row; the caller sums those.
        text += [f"    chunks = {sums[0]}.shape[0]\n",
                 "    for t in prange(chunks):\n",
                 "        for r in range(n_rows * t // chunks, n_rows * (t + 1) // chunks):\n",
                 body("t", " " * 12)]
    else:
        text += ["    for r in prange(n_rows):\n", body("0", " " * 8)]
    return "".join(text)
