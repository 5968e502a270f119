"""Which initializers of an imported graph may become trainable parameters.

A floating-point initializer may, unless its value is needed while a plan is
built (a Reshape's shape, a Pad's constant, a Clip's bounds: anything that
feeds a converter's `static_inputs`, directly or through other nodes) or it
holds statistics rather than weights (BatchNormalization's running mean and
variance, which stay constant as PyTorch keeps them buffers). Integer, bool
and string initializers are never trainable; neither are `Constant` nodes.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import OnnxImportError
from .loader import GraphSpec


def frozen_reasons(spec: GraphSpec) -> dict[str, str]:
    """For each initializer that cannot be trained, why (the others may be)."""
    reasons: dict[str, str] = {}
    for name, array in spec.initializers.items():
        if array.dtype.kind != "f":
            reasons[name] = f"it is {array.dtype}, not floating point"
    # name -> the build-time read it ends in; walked backwards, so that what feeds a
    # build-time value is itself needed at build time.
    needed_static: dict[str, str] = {}
    for node in reversed(spec.nodes):
        proto, conv = node.proto, node.converter
        label = f"{proto.op_type} node {proto.name or '#' + str(node.index)!r}"
        downstream = next((needed_static[o] for o in proto.output if o in needed_static), None)
        for position, name in enumerate(proto.input):
            if not name:
                continue
            if downstream is not None:
                needed_static.setdefault(name, f"it feeds {label}, and of that: {downstream}")
            elif position in conv.static_inputs:
                needed_static.setdefault(name, f"{label} reads it (input {position}) as a "
                                               "value known when the plan is built")
            elif position in conv.statistics_inputs and name in spec.initializers:
                reasons.setdefault(name, f"{label} reads it (input {position}) as running "
                                         "statistics, which fine-tuning keeps constant")
    for name, why in needed_static.items():
        if name in spec.initializers:
            reasons.setdefault(name, why)
    return reasons


def choose_trainable(spec: GraphSpec, trainable: bool | Iterable[str]) -> list[str]:
    """The initializers to make parameters, in the file's order: every eligible one for
    `trainable=True`, none for False, or exactly those named (each must be eligible)."""
    if trainable is False or trainable is None:
        return []
    reasons = frozen_reasons(spec)
    if trainable is True:
        return [name for name in spec.initializers if name not in reasons]
    if isinstance(trainable, str):
        raise TypeError("load: trainable must be True, False or a collection of initializer "
                        f"names, not the string {trainable!r} (wrap it in a list)")
    names = list(trainable)
    problems = []
    for name in names:
        if not isinstance(name, str):
            problems.append(f"{name!r}: not a name")
        elif name not in spec.initializers:
            problems.append(f"{name!r}: no initializer has this name")
        elif name in reasons:
            problems.append(f"{name!r}: {reasons[name]}")
    if problems:
        raise OnnxImportError("load: these initializers cannot be trained:\n  " +
                              "\n  ".join(problems))
    chosen = set(names)
    return [name for name in spec.initializers if name in chosen]
