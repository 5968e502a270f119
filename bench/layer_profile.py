"""Time per step of an inference plan, convolutions grouped by shape, with GFLOP/s.

Each of the plan's forward steps is wrapped in a timer for the duration of the
profile; a step's time is its best over the calls (the least disturbed by other
load), and a group's time the sum of its steps' bests. A convolution step is one whose
first op is conv2d (alone, or with its epilogue); its flops are 2 N O OH OW C/g kh kw.
Reads the plan's private step list (`_steps`, `_schedule`): a bench tool, not an API.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def _conv_shape(step: Any) -> tuple[str, float] | None:
    """(a group name, flops) of a convolution step, or None for any other step."""
    conv = step.eqns[0]
    if conv.primitive.name != "conv2d":
        return None
    x, w = conv.args
    n, o, oh, ow = conv.out.shape
    cg, kh, kw = w.shape[1:]
    stride = tuple(conv.params["stride"])
    if (kh, kw) == (1, 1) and stride == (1, 1):
        kind = "1x1 stride 1"
    elif stride == (1, 1):
        kind = f"{kh}x{kw} stride 1"
    elif x.shape[1] <= 4:
        kind = f"{kh}x{kw} stem, stride {stride[0]}"
    else:
        kind = f"{kh}x{kw} stride {stride[0]}"
    return kind, 2.0 * n * o * oh * ow * cg * kh * kw


def profile_steps(plan: Any, call: Callable[[], object], calls: int,
                  clock: Callable[[], float] = time.perf_counter) -> list[tuple]:
    """Per step of `plan` (by position): (step, best seconds by `clock`), over `calls`
    calls."""
    steps = list(plan._steps)
    best = [float("inf")] * len(steps)

    def timed(i: int, impl: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            result = impl(*args, **kwargs)
            best[i] = min(best[i], clock() - start)
            return result
        return run

    plan._steps = [(timed(i, s[0]), *s[1:]) for i, s in enumerate(steps)]
    try:
        for _ in range(calls):
            call()
    finally:
        plan._steps = steps
    return list(zip(plan._schedule, best))


def report(timings: list[tuple]) -> str:
    """A table: convolutions by shape (count, ms, GFLOP/s), then the other steps by kind."""
    convs: dict[str, list[float]] = {}
    others: dict[str, list[float]] = {}
    for step, seconds in timings:
        shape = _conv_shape(step)
        if shape is None:
            name = "fused elementwise chain" if step.fused else step.name
            entry = others.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += seconds
        else:
            kind, flops = shape
            # (Trees before epilogue fusion have no such field on their steps.)
            kind += " (with epilogue)" if getattr(step, "epilogue", False) else ""
            entry = convs.setdefault(kind, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += seconds
            entry[2] += flops
    lines = ["| convolutions | count | ms | GFLOP/s |", "|---|---:|---:|---:|"]
    for kind, (count, seconds, flops) in sorted(convs.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {kind} | {count} | {seconds * 1e3:.2f} | {flops / seconds / 1e9:.0f} |")
    total = sum(v[1] for v in convs.values())
    flops = sum(v[2] for v in convs.values())
    lines.append(f"| all convolutions | {sum(v[0] for v in convs.values())} | "
                 f"{total * 1e3:.2f} | {flops / total / 1e9:.0f} |")
    lines += ["", "| other steps | count | ms |", "|---|---:|---:|"]
    for name, (count, seconds) in sorted(others.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {name} | {count} | {seconds * 1e3:.2f} |")
    everything = total + sum(v[1] for v in others.values())
    lines.append(f"| sum of all steps' bests | {len(timings)} | {everything * 1e3:.2f} |")
    return "\n".join(lines)


def layer_profile(plan: Any, call: Callable[[], object], calls: int = 8,
                  clock: Callable[[], float] = time.perf_counter) -> str:
    """The per-step table of `plan` run by `call` (which calls the plan) `calls` times."""
    return report(profile_steps(plan, call, calls, clock))
