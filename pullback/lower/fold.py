"""Folding per-channel affine maps into the convolution before them, for inference plans.

An eval-mode batch_norm after a conv2d is `y * scale + shift` per output channel, and so
is ONNX's BatchNormalization as pullback imports it (a mul and an add by per-channel
constants). A chain `conv2d -> add/mul by per-channel vectors -> batch_norm(eval) ->
...` is rewritten when each link's result has no other reader and none is a result of
the plan (nor state); values are equal up to rounding (products summed in another order).

How depends on when the folded values can be computed:
- once, at lowering, when everything they come from is a constant the plan owns (an
  ONNX model's initializers, and what is computed from them): the scale goes into the
  weights, `conv2d(x, w * scale) + shift`, and the plan never multiplies again;
- at every call otherwise (a parameter an optimizer may update in place, a module's
  running statistics, which may be overwritten in place): each batch_norm becomes the
  scale and shift per channel its own implementation computes, from the current values
  at each call (O(channels)), a mul and an add that the convolution's epilogue
  (epilogue.py) applies with no pass of its own, bit for bit as the batch_norm would;
  scaling the weights at each call would cost a pass over them (ResNet-50's 100 MB at
  batch 1), more than it saves.
Training plans never fold: their batch norms train.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..backend.current import get_backend
from ..ops.batchnorm import batch_norm_p
from ..ops.conv import conv2d_p
from ..ops.elementwise import add_p, div_p, mul_p, sqrt_p
from ..ops.shape import reshape_p
from .graph import Eqn, StaticGraph, Var


@dataclass
class Fold:
    """One rewrite: the ops `absorbed` after `conv`, folded into its weights `weight` (a
    constant computed at lowering) or, when `weight` is None, into one scale and shift
    per channel computed at every call."""

    conv: Eqn
    absorbed: list[Eqn]
    weight: Var | None

    def describe(self) -> str:
        ops = ", ".join(f"{e.primitive.name} {e.out!r}" for e in self.absorbed)
        if self.weight is not None:
            return (f"conv2d {self.conv.out!r}: {ops} folded into its weights "
                    f"{self.weight!r} and a bias, computed once, at lowering")
        return (f"conv2d {self.conv.out!r}: {ops} as a scale and shift per channel, "
                "computed at every call (from parameters or buffers), applied in the "
                "convolution's epilogue")


def fold_into_convolutions(graph: StaticGraph) -> list[Fold]:
    """Rewrite `graph` in place, each foldable chain after a conv2d folded into its
    weights and a bias add; returns what was folded."""
    readers = graph.readers()
    results = {v.index for v in graph.outputs} | {new.index for _, _, new in graph.state}
    static = _static_values(graph)
    lowerable = _lowerable_values(graph, results)
    folds: list[Fold] = []
    replaced: dict[int, list[Eqn]] = {}  # id(an equation) -> the equations replacing it
    removed: set[int] = set()
    for eqn in graph.eqns:
        if eqn.primitive is not conv2d_p or eqn.out.dtype.kind != "f":
            continue
        chain = _chain(eqn, readers, results, static)
        if not any(link.primitive is not add_p for link, _ in chain):
            continue  # nothing to fold into the weights (bias adds stay as they are)
        sources = [eqn.args[1]] + [a for link, operand in chain
                                   for a in (link.args[1:] if operand is link else (operand,))]
        links = [link for link, _ in chain]
        if all(a is None or a.index in lowerable for a in sources):
            rewrite = _Rewrite(graph, eqn)
            for link, operand in chain:
                rewrite.absorb(link, operand)
            replaced[id(links[-1])], weight = rewrite.into_weights(links[-1].out)
            removed.update(id(e) for e in [eqn, *links])
        else:  # each batch_norm as its mul and add, in place; the rest as it is
            norms = [link for link in links if link.primitive is batch_norm_p]
            if not norms:
                continue
            for link in norms:
                rewrite = _Rewrite(graph, eqn)
                replaced[id(link)] = rewrite.expand(link)
            weight = None
        folds.append(Fold(eqn, links, weight))
    if not folds:
        return folds
    eqns: list[Eqn] = []
    for eqn in graph.eqns:
        if id(eqn) in replaced:
            eqns.extend(replaced[id(eqn)])
        elif id(eqn) not in removed:
            eqns.append(eqn)
    graph.eqns = eqns
    _evaluate_constants(graph, [e for new in replaced.values() for e in new])
    return folds


def _static_values(graph: StaticGraph) -> set[int]:
    """The values that do not depend on the inputs: constants, parameters, and what is
    computed from those only."""
    static = {v.index for v in graph.vars if v.kind in ("const", "param")}
    for eqn in graph.eqns:
        if all(not isinstance(a, Var) or a.index in static
               for a in eqn.args + eqn.param_vars):
            static.add(eqn.out.index)
    return static


def _lowerable_values(graph: StaticGraph, results: set[int]) -> set[int]:
    """The values that can be computed once, at lowering: the constants the plan owns
    (arrays, not a tensor's) and what pure equations compute from those only (results
    aside: see `_evaluate_constants`)."""
    known = {v.index for v, _ in graph.consts if v.index not in graph.tensor_consts}
    for eqn in graph.eqns:
        if _pure(eqn) and eqn.out.index not in results and all(
                not isinstance(a, Var) or a.index in known for a in eqn.args):
            known.add(eqn.out.index)
    return known


def _per_channel(a: Any, channels: int, dtype: Any, static: set[int]) -> bool:
    """Whether `a` is a vector of one value per channel of an (N, C, H, W) value,
    shaped to broadcast over it, and the same for every input."""
    return (isinstance(a, Var) and a.index in static and a.dtype == dtype
            and a.shape in ((1, channels, 1, 1), (channels, 1, 1)))


def _chain(conv: Eqn, readers: dict, results: set[int], static: set[int]) -> list[tuple]:
    """The ops after `conv` that fold into it, each with its per-channel operand (a
    batch_norm's: the batch_norm itself), each the only reader of the value before it."""
    chain: list[tuple[Eqn, Any]] = []
    value = conv.out
    channels, dtype = value.shape[1], value.dtype
    while value.index not in results and len(readers.get(value.index, ())) == 1:
        (eqn,) = readers[value.index]
        if eqn.out.shape != value.shape or eqn.out.dtype != dtype:
            break
        prim = eqn.primitive
        if prim in (add_p, mul_p) and len(eqn.args) == 2 and value in eqn.args:
            other = eqn.args[1] if eqn.args[0] is value else eqn.args[0]
            if other is value or not _per_channel(other, channels, dtype, static):
                break
            chain.append((eqn, other))
        elif (prim is batch_norm_p and not eqn.params["training"] and eqn.args[0] is value
              and all(a is None or (isinstance(a, Var) and a.index in static)
                      for a in eqn.args[1:])):
            chain.append((eqn, eqn))
        else:
            break
        value = eqn.out
    return chain


class _Rewrite:
    """The equations of one fold: the per-channel scale and shift as (C,) vectors, then
    the scaled weights, the convolution and its bias add (or a batch_norm's mul and add
    on the activations)."""

    def __init__(self, graph: StaticGraph, conv: Eqn):
        self.graph, self.conv = graph, conv
        self.channels = conv.out.shape[1]
        self.eqns: list[Eqn] = []
        self.scale: Var | None = None
        self.shift: Var | None = None

    def emit(self, prim: Any, *args: Any, out: Var | None = None, **params: Any) -> Var:
        if out is None:
            shape, dtype = prim.abstract_eval(*args, **params)
            out = self.graph.new_var(shape, dtype, "value")
        eqn = Eqn(prim, args, params, out)
        out.producer = eqn
        self.eqns.append(eqn)
        return out

    def vector(self, a: Var) -> Var:
        return self.emit(reshape_p, a, shape=(self.channels,))

    def times(self, a: Var | None, b: Var) -> Var:
        return b if a is None else self.emit(mul_p, a, b)

    def plus(self, a: Var | None, b: Var) -> Var:
        return b if a is None else self.emit(add_p, a, b)

    def normalization(self, link: Eqn) -> tuple[Var, Var]:
        """An eval-mode batch_norm's scale and shift per channel, in the order its own
        implementation computes them (ops/batchnorm.py `_eval_affine`)."""
        _, mean, var, weight, bias = link.args
        factor = self.emit(div_p, 1.0, self.emit(sqrt_p, self.emit(
            add_p, var, link.params["eps"])))
        if weight is not None:
            factor = self.emit(mul_p, factor, weight)
        offset = self.emit(mul_p, self.emit(mul_p, mean, factor), -1.0)
        if bias is not None:
            offset = self.emit(add_p, offset, bias)
        return factor, offset

    def absorb(self, link: Eqn, operand: Any) -> None:
        """(y * scale + shift) followed by `link` is y * scale' + shift'."""
        if link.primitive is add_p:
            self.shift = self.plus(self.shift, self.vector(operand))
            return
        if link.primitive is mul_p:
            factor, offset = self.vector(operand), None
        else:
            factor, offset = self.normalization(link)
        self.scale = self.times(self.scale, factor)
        if self.shift is not None:
            self.shift = self.emit(mul_p, self.shift, factor)
        if offset is not None:
            self.shift = self.plus(self.shift, offset)

    def into_weights(self, result: Var) -> tuple[list[Eqn], Var]:
        """The equations computing `result` as conv2d(x, w * scale) + shift, and the
        folded weights."""
        x, w = self.conv.args
        column = self.emit(reshape_p, self.scale, shape=(self.channels, 1, 1, 1))
        weight = self.emit(mul_p, w, column)
        if self.shift is None:
            self.emit(conv2d_p, x, weight, out=result, **self.conv.params)
        else:
            y = self.emit(conv2d_p, x, weight, **self.conv.params)
            row = (1, self.channels, 1, 1)
            self.emit(add_p, y, self.emit(reshape_p, self.shift, shape=row), out=result)
        return self.eqns, weight

    def expand(self, link: Eqn) -> list[Eqn]:
        """The equations computing the batch_norm `link`'s result as x * scale + shift."""
        factor, offset = self.normalization(link)
        row = (1, self.channels, 1, 1)
        scaled = self.emit(mul_p, link.args[0], self.emit(reshape_p, factor, shape=row))
        self.emit(add_p, scaled, self.emit(reshape_p, offset, shape=row), out=link.out)
        return self.eqns


def _evaluate_constants(graph: StaticGraph, eqns: list[Eqn]) -> None:
    """Compute at lowering each of `eqns`, and each equation they depend on, whose
    operands are all constants the plan owns: arrays, not a tensor's (a module's
    buffers, which may change in place between calls). Its result becomes such a
    constant. Only pure equations are computed so: a differentiable primitive (a
    function of its operands; random draws such as dropout_mask are not) with at
    least one operand and no function among its parameters."""
    wanted = {id(e) for e in eqns}
    for eqn in reversed(graph.eqns):  # ... and what they read, back to the constants
        if id(eqn) in wanted:
            wanted.update(id(a.producer) for a in eqn.args
                          if isinstance(a, Var) and a.producer is not None)
    owned = {v.index: data for v, data in graph.consts if v.index not in graph.tensor_consts}
    # A result of the plan stays a step: the caller gets a fresh array at every call.
    results = {v.index for v in graph.outputs} | {new.index for _, _, new in graph.state}
    backend = get_backend()
    done: set[int] = set()
    for eqn in graph.eqns:
        if id(eqn) not in wanted or eqn.out.index in results or not _pure(eqn) or not all(
                not isinstance(a, Var) or a.index in owned for a in eqn.args):
            continue
        values = [owned[a.index] if isinstance(a, Var) else a for a in eqn.args]
        data = eqn.primitive.impl(backend, *values, **eqn.params)
        eqn.out.kind, eqn.out.producer = "const", None
        graph.consts.append((eqn.out, data))
        graph.computed_consts.add(eqn.out.index)
        owned[eqn.out.index] = data
        done.add(id(eqn))
    graph.eqns = [e for e in graph.eqns if id(e) not in done]


def _pure(eqn: Eqn) -> bool:
    return (eqn.primitive.differentiable and eqn.primitive is not conv2d_p
            and not eqn.param_vars and any(isinstance(a, Var) for a in eqn.args)
            and not any(callable(v) for v in eqn.params.values()))
