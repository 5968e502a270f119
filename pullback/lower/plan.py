"""Plans: a static graph lowered to steps over slots, for inference or training.

A plan runs each primitive's forward on the current backend with as little
Python as possible per step, and drops every value right after its last use.
An INFERENCE plan keeps nothing for backward; it folds eval-mode batch norms into
the convolutions before them (fold.py). Both kinds run each convolution with the
per-channel ops, residual add and relu after it as one step (epilogue.py), where
backward reads none of their partial results. A TRAINING plan keeps
exactly the values each backward step reads (the activation cache), frees each one
when the last backward step that reads it is done, and leaves every parameter's
gradient in its `.grad`, accumulated as `loss.backward()` would.
"""

from __future__ import annotations

import copy
import enum
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from ..ad import BackwardSchedule, DerivativeError, Leaf, Node, run_schedule
from ..backend.backward_ops import BackwardOps
from ..backend.current import get_backend
from ..ops.elementwise import add_p, relu_p
from ..tensor import hooks
from ..tensor.backward import EagerExecutor, accumulate_grad
from ..tensor.eager import saved_as_float, wrap
from . import buffers, cotangents
from .backward_folds import matmul_bias_folds
from .fold import fold_into_convolutions
from .fuse import Step, schedule
from .graph import Eqn, LoweringError, StaticGraph, Var, resolve_params, trace
from .retrace import Retracer

if TYPE_CHECKING:
    from ..tensor import Tensor

# What a compiled function returns, and so its plan: a tensor, or a tuple of tensors.
_R = TypeVar("_R", bound="Tensor | Sequence[Tensor]")


def _accumulate(param: Tensor, ct: Any, taken: set[int]) -> None:
    """Leave a cotangent in `param.grad`. A plan's cotangents are its own fresh arrays, so
    when one is C-ordered and the sole view of its buffer, the gradient takes it over
    instead of copying it (7 MiB a step on the wide MLP). `taken` holds the ids of
    buffers that are not free to take: the plan's inputs, parameters and values, and
    buffers already handed to another parameter (a cotangent may reach two)."""
    if param.grad is None and type(ct) is np.ndarray and ct.dtype == param.dtype \
            and ct.flags.c_contiguous and ct.flags.writeable:
        owner = ct if ct.base is None else ct.base
        if type(owner) is np.ndarray and owner.base is None and owner.nbytes == ct.nbytes \
                and id(owner) not in taken:
            taken.add(id(owner))
            param.grad = wrap(ct, None)
            return
    accumulate_grad(param, ct, False)


class PlanDerivativeError(LoweringError, DerivativeError):
    """A derivative that failed while a training plan ran its backward (a custom op's
    backward that returned no gradient for a parameter's input): caught as either."""


class LoweringMode(enum.Enum):
    """INFERENCE (the default): forward only. TRAINING: the loss and its gradients."""

    INFERENCE = "inference"
    TRAINING = "training"


def compile(fn: Callable[..., _R], *example_inputs: object,
            mode: LoweringMode = LoweringMode.INFERENCE) -> Plan[_R]:
    """Trace `fn` (a function or a module) on the examples and lower it to a plan, called
    like the function and returning what it returns (a tuple where it returns a list).
    Tensors and arrays among the examples are the plan's inputs; anything else (a
    module) is bound at compile time.

    A plan never runs stale: called with inputs of other shapes or dtypes (a last
    partial batch), after a module it closes over switched between `train()` and
    `eval()`, or after a parameter was replaced (`model.fc.weight = nn.Parameter(...)`),
    it traces `fn` again and keeps the plans of the last 8 such signatures (least
    recently used dropped first; `plan.traces` counts the traces). While tracing,
    reading a traced value concretely (`float(t)`, `bool(t)`, `t.item()`,
    `np.asarray(t)`) raises `TracingError` instead of baking it into the plan."""
    if not callable(fn):
        raise TypeError(f"compile: expected a function or a module, got {type(fn).__name__}")
    if not isinstance(mode, LoweringMode):
        raise TypeError(f"compile: mode must be a LoweringMode, not {mode!r}")

    def lower(examples: tuple[object, ...]) -> Plan[Any]:
        graph, single = trace(fn, examples)
        if mode is LoweringMode.TRAINING:
            return TrainingPlan(graph, single)
        return Plan(graph, single)

    return Retracer(fn, example_inputs, lower).first()


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _describe(var: Var) -> str:
    return f"{var.shape} {var.dtype}"


class Plan(Generic[_R]):
    """An inference plan: `plan(*inputs)` returns what the traced function returned.

    A plan from `compile` traces its function again when called with inputs of other
    shapes or dtypes, or after a module's train/eval mode or a parameter's identity
    changed (see `compile`); `traces` counts the traces so far."""

    mode: LoweringMode = LoweringMode.INFERENCE
    _retracer: Retracer | None = None  # set by `compile`: the plans of other signatures

    @property
    def traces(self) -> int:
        """How many times the function was traced (once, unless a signature changed)."""
        return 1 if self._retracer is None else self._retracer.traces

    def __init__(self, graph: StaticGraph, single: bool) -> None:
        inference = self.mode is LoweringMode.INFERENCE
        # Per value, the bytes its step keeps beside it for backward (`saving_bytes`).
        self._beside: dict[int, int] = {}
        # Inference only: a training plan's batch norms train, and its weights are
        # differentiated as they are.
        self._folds = fold_into_convolutions(graph) if inference else []
        self.graph = graph
        self.single = single
        self._scalar_slots: dict[Any, int] = {}
        self._template: list[Any] = [None] * len(graph.vars)
        for var, data in graph.consts:
            self._template[var.index] = data
        self._views: set[int] = set()  # views of parameters (w.T), kept at no cost
        # Values written into buffers (state): results of the plan, written back per call.
        self._state = {new.index for _, _, new in graph.state}
        self._saved: set[int] = self._plan_backward()
        # Convolutions with their epilogues in both modes: a member's partial result is
        # never saved for backward (`keep`).
        self._schedule = schedule(graph, keep=self._saved | self._state)
        self._frees = self._forward_frees(keep=self._saved | self._state)
        self._owner, self._buffers, self._fortran = buffers.assign(
            self._schedule, self._frees, self._saved,
            {v.index for v in graph.outputs} | self._state)
        self._arena: list[np.ndarray] | None = None  # allocated at the first call
        self._lock = threading.Lock()  # one call at a time: calls share the arena
        self._steps = [self._step(step) for step in self._schedule]

    def _plan_backward(self) -> set[int]:
        """The values backward reads (none: an inference plan has no backward)."""
        return set()

    # ------------------------------------------------------------ building

    def _slot(self, arg: Any) -> int:
        if isinstance(arg, Var):
            return arg.index
        key = (type(arg), arg)
        slot = self._scalar_slots.get(key)
        if slot is None:  # a Python scalar operand gets a constant slot of its own
            slot = len(self._template)
            self._template.append(arg)
            self._scalar_slots[key] = slot
        return slot

    def _step(self, step: Step) -> tuple:
        buf = self._owner.get(step.out.index, -1)
        impl = step.impl if buf < 0 else buffers.writer(step)
        return impl, tuple(self._slot(a) for a in step.args), step.params, step.out.index, buf

    def _forward_frees(self, keep: set[int]) -> list[tuple[int, ...]]:
        """After each forward step, the value slots no later step (nor the result) reads."""
        last: dict[int, int] = {}
        for i, step in enumerate(self._schedule):
            for a in step.args:
                if isinstance(a, Var) and a.kind == "value":
                    last[a.index] = i
            last.setdefault(step.out.index, i)
        for out in self.graph.outputs:
            last.pop(out.index, None)
        frees: list[list[int]] = [[] for _ in self._schedule]
        for slot, i in last.items():
            if slot not in keep:
                frees[i].append(slot)
        return [tuple(f) for f in frees]

    # ------------------------------------------------------------ running

    def _start(self, inputs: tuple) -> list[Any]:
        arrays = [x for x in inputs if hasattr(x, "shape")]
        if len(arrays) != len(self.graph.inputs):
            raise TypeError(f"plan: expected {len(self.graph.inputs)} tensor inputs, got "
                            f"{len(arrays)}")
        env = list(self._template)
        for index, (var, x) in enumerate(zip(self.graph.inputs, arrays)):
            data = x._data if hasattr(x, "_data") else np.asarray(x)
            if data.shape != var.shape or data.dtype != var.dtype:
                raise LoweringError(
                    f"plan: input {index} has shape {data.shape} and dtype {data.dtype}, but "
                    f"the plan was lowered for {_describe(var)}; compile again for other "
                    "shapes or dtypes")
            env[var.index] = data
        for var, p in self.graph.params:
            env[var.index] = p._data  # the parameter's current value, read at every call
        for tensor, start, _ in self.graph.state:
            if start is not None:
                env[start.index] = tensor._data  # a buffer's current values, likewise
        return env

    def _write_state(self, env: list[Any]) -> None:
        """Each buffer the traced function wrote takes this call's values, in place (as
        the eager call's update did), so the next call and the module see them."""
        for tensor, _, new in self.graph.state:
            np.copyto(tensor._data, env[new.index], casting="unsafe")

    def _forward(self, env: list[Any]) -> None:
        backend = get_backend()
        arena = self._arena
        if arena is None:
            arena = self._arena = [b.allocate() for b in self._buffers]
        for (impl, slots, params, out, buf), frees in zip(self._steps, self._frees):
            if buf < 0:
                env[out] = impl(backend, *[env[s] for s in slots], **params)
            else:
                env[out] = impl(backend, *[env[s] for s in slots], out=arena[buf], **params)
            for s in frees:
                env[s] = None

    def __call__(self, *inputs: object) -> _R:
        """The traced function's result for these inputs (its tensor arguments, and its
        other arguments, which were bound at compile time)."""
        retracer = self._retracer
        plan = self if retracer is None else retracer.plan_for(inputs, self)
        return plan._call(inputs)

    def _call(self, inputs: tuple) -> Any:
        with self._lock:
            env = self._start(inputs)
            self._forward(env)
            self._write_state(env)
            outs = tuple(wrap(env[v.index], None) for v in self.graph.outputs)
        return outs[0] if self.single else outs

    # ------------------------------------------------------------ explaining

    def explain(self) -> str:
        """The plan as text: its steps, buffers, saved activations and peak memory."""
        g = self.graph
        fused = sum(step.fused and not (step.epilogue or step.norm_relu)
                    for step in self._schedule)
        epilogues = sum(step.epilogue and step.eqns[0].primitive.name == "conv2d"
                        for step in self._schedule)
        dense = sum(step.epilogue for step in self._schedule) - epilogues
        norm_relus = sum(step.norm_relu for step in self._schedule)
        lines = [f"plan ({self.mode.value}): {len(g.inputs)} inputs, {len(g.params)} "
                 f"parameters, {len(self._schedule)} forward steps ({len(g.eqns)} ops, "
                 f"{fused} fused chains"
                 + (f", {epilogues} convolutions with their epilogue" if epilogues else "")
                 + (f", {dense} matrix products with their bias" if dense else "")
                 + (f", {norm_relus} batch norms with the relu after them" if norm_relus
                    else "")
                 + (f", {len(self._folds)} folds into convolutions" if self._folds else "")
                 + ")"]
        for v in g.inputs:
            lines.append(f"  input {v!r}: {_describe(v)}")
        for v, p in g.params:
            name = getattr(p._node, "name", None) or "parameter"
            lines.append(f"  param {v!r} ({name}): {_describe(v)}")
        for fold in self._folds:
            lines.append(f"  folded: {fold.describe()}")
        for _, _, new in g.state:
            lines.append(f"  state {new!r}: {_describe(new)}, written back into the buffer it "
                         "updates after every call")
        lines.append("forward:")
        for i, step in enumerate(self._schedule):
            args = ", ".join(repr(a) for a in step.args)
            note = "  [kept for backward]" if step.out.index in self._saved else ""
            if self._beside.get(step.out.index):
                note += (f" (with {_fmt_bytes(self._beside[step.out.index])} beside it that "
                         "its backward reads)")
            if step.out.index in self._owner:
                b = self._owner[step.out.index]
                order = " (by columns)" if self._buffers[b].order == "F" else ""
                note = f"  in buffer b{b}{order}" + note
            size = _fmt_bytes(self._bytes(step.out.index))
            if step.out.index in self._views:
                size = "a view of a parameter"
            lines.append(f"  {i:3d}  {step.out!r} = {step.name}({args})  "
                         f"{_describe(step.out)}  {size}{note}")
            if step.fused:
                inner = "; ".join(f"{e.out!r} = {e.primitive.name}("
                                  + ", ".join(repr(a) for a in e.args) + ")"
                                  for e in step.eqns)
                product = step.eqns[0].primitive.name == "matmul"
                how = ("the product, its bias and any residual add or relu after it applied "
                       "to each block of its result in cache" if step.epilogue and product else
                       "the convolution, its epilogue applied to each chunk of its output "
                       "in cache" if step.epilogue else "the batch norm's kernel writing "
                       "relu's result" if step.norm_relu else "one kernel")
                lines.append(f"       {how}, no intermediates stored: {inner}")
        if self._buffers:
            shared = len(self._owner) - len(self._buffers)
            lines.append(f"buffers: {len(self._buffers)} preallocated "
                         f"({_fmt_bytes(sum(b.nbytes for b in self._buffers))}), reused across "
                         f"calls; {shared} of {len(self._owner)} values take over a buffer "
                         "an earlier value is done with")
        lines += self._explain_backward()
        lines.append(f"peak memory of values (estimated): {_fmt_bytes(self.peak_bytes())}")
        if self._retracer is not None:
            lines.append(f"traced {self.traces} time(s); plans kept for "
                         f"{len(self._retracer.plans)} signature(s) of input shapes, modules' "
                         "train/eval modes and parameters (at most 8)")
        return "\n".join(lines)

    def _explain_backward(self) -> list[str]:
        return []

    def _bytes(self, index: int) -> int:
        """Bytes a value holds of its own: a view of a parameter holds none; one whose
        step keeps what its backward reads beside it holds that too."""
        if index in self._views:
            return 0
        return self.graph.vars[index].nbytes + self._beside.get(index, 0)

    def peak_bytes(self) -> int:
        """The most bytes of step results alive at once (inputs and parameters aside)."""
        return self._forward_memory()[0]

    def _forward_memory(self) -> tuple[int, int]:
        """(peak, still alive at the end) of step results over the forward steps."""
        live, peak = 0, 0
        for step, frees in zip(self._schedule, self._frees):
            live += self._bytes(step.out.index)
            peak = max(peak, live)
            live -= sum(self._bytes(s) for s in frees)
        return peak, live


class TrainingPlan(Plan[_R]):
    """`plan(*inputs)` runs forward and backward: returns the loss, and leaves each
    parameter's gradient in its `.grad` (accumulated, as `loss.backward()` does).

    A function may return `(loss, *aux)`: the extra outputs (logits, say) are
    returned after the loss and not differentiated. Each parameter's gradient is left
    in `.grad` the moment it is final, and the gradient-ready hooks (tensor/hooks.py) are
    called then, while the rest of the backward runs."""

    mode = LoweringMode.TRAINING

    def __init__(self, graph: StaticGraph, single: bool) -> None:
        if graph.outputs[0].shape not in ((), (1,)) or graph.outputs[0].dtype.kind != "f":
            raise LoweringError("compile: a TRAINING plan needs a function returning one "
                                f"floating scalar loss (first, if it returns several); this "
                                f"one returns "
                                f"{[_describe(v) for v in graph.outputs]}")
        super().__init__(graph, single)
        # Buffers for the large cotangents, once the forward's layouts are known.
        folded = {out: [relu_input] for out, relu_input in self._pool_relu.items()}
        folded.update({out: list(add.args) for out, add in (*self._relu_bias.items(),
                                                            *self._pool_bias.items())})
        folded.update({out: [*fold.product.args, fold.add.args[1]]
                       for out, fold in self._matmul_bias.items()})
        self._ct_owner, self._ct_buffers = cotangents.assign(
            self._backward, folded,
            self._folded_relus | self._folded_adds | self._folded_products, self._fortran,
            {out: fold.product for out, fold in self._matmul_bias.items()})
        self._ct_writers = [None if b < 0 else cotangents.writer(eqn.primitive)
                            for (eqn, *_), b in zip(self._backward, self._ct_owner)]
        # Per backward step, whether its parameters hold values computed from the
        # inputs (resolved at each call): worked out once, not per step and call.
        self._traced_params = [bool(eqn.param_vars) for eqn, *_ in self._backward]
        self._ct_arena: list[np.ndarray] | None = None

    def _step(self, step: Step) -> tuple:
        impl, slots, params, out, buf = super()._step(step)
        prim = step.eqns[0].primitive
        if (prim.saving_impl is not None and not step.fused and impl is prim.impl
                and out in self._active):
            impl = prim.saving_impl  # its backward runs: keep what that reads
            if prim.saving_bytes is not None:
                self._beside[out] = prim.saving_bytes(*step.args, **step.params)
        return impl, slots, params, out, buf

    def _plan_backward(self) -> set[int]:
        self._active = self._find_active()
        if self.graph.outputs[0].index not in self._active:
            raise LoweringError("compile: the loss does not depend on any parameter")
        self._backward = self._backward_steps()
        self._pool_relu = self._relu_into_pool()
        # The relus those pools fold in: their own backward steps receive no cotangent.
        self._folded_relus = {eqn.args[0].index for eqn, *_ in self._backward
                              if eqn.out.index in self._pool_relu}
        self._relu_bias, self._pool_bias = self._bias_folds()
        self._folded_adds = {add.out.index for add in (*self._relu_bias.values(),
                                                        *self._pool_bias.values())}
        self._matmul_bias = matmul_bias_folds(
            self.graph, self._active, {v.index for v in self.graph.outputs} | self._state)
        self._folded_products = {f.product.out.index for f in self._matmul_bias.values()}
        step_of = {eqn.out.index: k for k, (eqn, *_) in enumerate(self._backward)}
        # Per folded bias add, the backward step of its product, whose reads it takes.
        self._product_step = {out: step_of[f.product.out.index]
                              for out, f in self._matmul_bias.items()}
        # Per call, by whether the backend's fused kernels run (only they fold).
        self._schedules = {False: self._schedule_plain, True: self._folded_schedule()}
        return {s for step in self._backward for s in step[2]}

    def _relu_into_pool(self) -> dict[int, Var]:
        """max_pool2d steps whose input is a relu's output read by nothing else: per pool
        output, the relu's input. Their backward becomes one step: the pool routes each
        upstream value to its window's maximum, where relu's output is that maximum, so
        relu's mask is `pooled > 0` applied to the small upstream before the routing (one
        pass over the large gradient saved)."""
        readers = {index: len(eqns) for index, eqns in self.graph.readers().items()}
        results = {v.index for v in self.graph.outputs}
        folded: dict[int, Var] = {}
        for eqn in self.graph.eqns:
            y = eqn.args[0] if eqn.args else None
            relu = getattr(y, "producer", None)
            if (eqn.primitive.absorbs is not None and isinstance(y, Var) and relu is not None
                    and relu.primitive is eqn.primitive.absorbs and readers.get(y.index) == 1
                    and y.index not in results and y.index in self._active
                    and isinstance(relu.args[0], Var) and relu.args[0].index in self._active):
                folded[eqn.out.index] = relu.args[0]
        return folded

    def _bias_folds(self) -> tuple[dict[int, Eqn], dict[int, Eqn]]:
        """The per-channel bias adds on (N, C, H, W) maps (a convolution's bias) that a
        relu alone reads, folded into a backward step after them: per relu output, the
        add before it (the relu's step becomes the backend's `relu_bias_backward`: one
        pass writes relu's gradient for the add's first operand and sums it per channel
        for the bias); and per max-pool output whose relu is folded in (`_pool_relu`),
        the add before that relu (the pool's step sums its masked upstream per channel,
        a quarter of the maps' size for 2 x 2 windows, each value of which its backward
        routes to one position of the maps: the same sums, but for a window of NaNs,
        which routes its value nowhere, when that value is NaN or infinite). Either way
        the add's step does nothing."""
        readers = {index: len(eqns) for index, eqns in self.graph.readers().items()}
        results = {v.index for v in self.graph.outputs} | self._state

        def bias_add(x: Any) -> Eqn | None:
            add = getattr(x, "producer", None)
            if (not isinstance(x, Var) or add is None or add.primitive is not add_p
                    or readers.get(x.index) != 1 or x.index in results
                    or x.index not in self._active or len(x.shape) != 4):
                return None
            maps, bias = add.args
            fits = (isinstance(maps, Var) and isinstance(bias, Var) and maps.shape == x.shape
                    and maps.dtype == bias.dtype == x.dtype
                    and bias.shape == (1, x.shape[1], 1, 1)
                    and maps.index in self._active and bias.index in self._active)
            return add if fits else None

        relu_bias: dict[int, Eqn] = {}
        for eqn in self.graph.eqns:
            if eqn.primitive is relu_p and eqn.out.index not in self._folded_relus:
                add = bias_add(eqn.args[0] if eqn.args else None)
                if add is not None:
                    relu_bias[eqn.out.index] = add
        pool_bias = {out: add for out, relu_input in self._pool_relu.items()
                     if (add := bias_add(relu_input)) is not None}
        return relu_bias, pool_bias

    def _find_active(self) -> set[int]:
        active = {v.index for v, _ in self.graph.params}
        for eqn in self.graph.eqns:
            if eqn.primitive.differentiable and eqn.out.dtype.kind == "f" and any(
                    isinstance(a, Var) and a.index in active for a in eqn.args):
                active.add(eqn.out.index)
        # Only what leads to the loss is differentiated.
        needed = {self.graph.outputs[0].index}
        for eqn in reversed(self.graph.eqns):
            if eqn.out.index in needed and eqn.primitive.differentiable:
                needed.update(a.index for a in eqn.args if isinstance(a, Var))
        unused = [self._param_name(v, p) for v, p in self.graph.params
                  if v.index not in needed]
        if unused:
            raise LoweringError(f"compile: parameters get no gradient (the loss does not "
                                f"depend on them): {', '.join(unused)}")
        return active & needed

    @staticmethod
    def _param_name(var: Var, p: Any) -> str:
        return f"{getattr(p._node, 'name', None) or 'parameter'} {var.shape}"

    def _backward_steps(self) -> list[tuple]:
        """Per active equation, in reverse: (eqn, node, saved slots, slots to free after)."""
        steps = []
        last_reader: dict[int, int] = {}
        # Views of parameters (w.T in a dense layer) cost no memory to keep; a backward
        # kernel given one can lay the parameter's gradient out like the parameter.
        param_views = self._views = {
            e.out.index for e in self.graph.eqns if e.primitive.aliasing == "view"
            and isinstance(e.args[0], Var) and e.args[0].kind == "param"}
        for eqn in self._backward_order():
            prim = eqn.primitive
            if not (prim.has_derivative or prim.transpose is not None or prim.vjp is not None):
                params = [self._param_name(v, p) for v, p in self.graph.params
                          if self._depends(eqn, v)]
                raise LoweringError(f"compile: {prim.name} has no derivative rule, and it lies "
                                    f"between {', '.join(params)} and the loss")
            parents = tuple(a if isinstance(a, Var) and a.index in self._active else None
                            for a in eqn.args)
            saves_in = prim.saves_inputs
            needed_in: tuple[int, ...]
            if saves_in and prim.bilinear and (parents[0] is None or parents[1] is None):
                needed_in = (1,) if parents[1] is None else (0,)
                needed_in += tuple(i for i in (0, 1) if i not in needed_in
                                   and isinstance(eqn.args[i], Var)
                                   and eqn.args[i].index in param_views)
            else:
                needed_in = tuple(range(len(eqn.args))) if saves_in else ()
            saved: tuple[int, ...] = tuple(eqn.args[i].index for i in needed_in
                                           if isinstance(eqn.args[i], Var))
            saved += tuple(v.index for v in eqn.param_vars)  # the rules read the params
            if prim.saves_output:
                saved += (eqn.out.index,)
            node = Node(prim, eqn.params, parents, None, None,
                        tuple(a.shape if isinstance(a, Var) else () for a in eqn.args),
                        eqn.out.shape, eqn.out.dtype)
            steps.append((eqn, node, saved, needed_in))
            for s in saved:
                last_reader[s] = len(steps) - 1
        frees: list[list[int]] = [[] for _ in steps]
        returned = {v.index for v in self.graph.outputs} | self._state
        for s, i in last_reader.items():
            if self.graph.vars[s].kind == "value" and s not in returned:
                frees[i].append(s)
        return [(eqn, node, saved, self._reads(eqn, needed_in), tuple(f))
                for (eqn, node, saved, needed_in), f in zip(steps, frees)]

    def _backward_order(self) -> list[Eqn]:
        """The active equations in the order the core's backward schedule visits them:
        the schedule eager backward runs over the same graph, computed once here over
        the core's nodes (a Leaf per parameter) and replayed at each call."""
        nodes: dict[int, Leaf | Node] = {}  # var index -> its node in the schedule
        self._node_of = nodes
        self._leaves: list[Leaf] = []
        for var, _ in self.graph.params:
            leaf = nodes[var.index] = Leaf(var.shape, var.dtype)
            self._leaves.append(leaf)
        eqn_of: dict[int, Eqn] = {}
        for eqn in self.graph.eqns:
            if eqn.out.index in self._active:
                parents = tuple(nodes.get(a.index) if isinstance(a, Var) else None
                                for a in eqn.args)
                node = nodes[eqn.out.index] = Node(eqn.primitive, eqn.params, parents, None,
                                                   None, (), eqn.out.shape, eqn.out.dtype)
                eqn_of[id(node)] = eqn
        self._param_of = {id(leaf): p for (_, p), leaf in zip(self.graph.params, self._leaves)}
        self._loss_node = nodes[self.graph.outputs[0].index]
        schedule = self._schedule_plain = BackwardSchedule([self._loss_node], self._leaves)
        steps = [n for n, end in zip(schedule.nodes, schedule.ends) if not end]
        self._step_of = {id(n): k for k, n in enumerate(steps)}
        return [eqn_of[id(n)] for n in steps]

    def _folded_schedule(self) -> BackwardSchedule:
        """The schedule with each relu folded into the max-pool after it: the pool's
        step hands its cotangent straight to the relu's input, so the relu's step
        receives none; each per-channel bias add folded into the relu or the max-pool
        after it: that step hands its cotangents straight to the add's operands; and each
        dense layer's product folded into the bias add after it: the add's step hands
        its cotangents to the product's operands and the bias (backward_folds.py)."""
        plain = self._schedule_plain
        folded = copy.copy(plain)
        folded.parents = list(plain.parents)
        for out, relu_input in self._pool_relu.items():
            i = plain.index[id(self._node_of[out])]
            folded.parents[i] = (plain.index.get(id(self._node_of[relu_input.index])),)
        for out, add in (*self._relu_bias.items(), *self._pool_bias.items()):
            i = plain.index[id(self._node_of[out])]
            folded.parents[i] = tuple(plain.index.get(id(self._node_of[a.index]))
                                      for a in add.args)
        for out, fold in self._matmul_bias.items():  # the add's step takes the product's
            i = plain.index[id(self._node_of[out])]
            folded.parents[i] = tuple(
                plain.index.get(id(self._node_of[a.index])) if isinstance(a, Var)
                and a.index in self._node_of else None
                for a in (*fold.product.args, fold.add.args[1]))
        return folded

    @staticmethod
    def _reads(eqn: Eqn, needed_in: tuple) -> tuple:
        """What a backward step hands its rule, worked out once: its inputs as a template
        (constants in place, None when it keeps none), the (position, slot) pairs to fill
        from the cache, whether saved integers must reach the rules as floats, and
        whether it reads its output."""
        prim = eqn.primitive
        constants = [None if isinstance(a, Var) else a for a in eqn.args]
        if not prim.saves_inputs:
            inputs = tuple(constants) if any(c is not None for c in constants) else None
            return inputs, (), False, prim.saves_output
        template = [None] * len(eqn.args)
        fill = []
        for i in needed_in:
            a = eqn.args[i]
            if isinstance(a, Var):
                fill.append((i, a.index))
            else:
                template[i] = a
        convert = not prim.exact_inputs and any(eqn.args[i].dtype.kind in "iub" for i, _ in fill)
        return tuple(template), tuple(fill), convert, prim.saves_output

    def _depends(self, eqn: Eqn, param: Var) -> bool:
        reach = {param.index}
        for e in self.graph.eqns:
            if any(isinstance(a, Var) and a.index in reach for a in e.args):
                reach.add(e.out.index)
            if e is eqn:
                break
        return eqn.out.index in reach

    def _call(self, inputs: tuple) -> Any:
        with self._lock:
            return self._step_once(inputs)

    def _step_once(self, inputs: tuple) -> Any:
        env = self._start(inputs)
        self._forward(env)
        loss = env[self.graph.outputs[0].index]
        arena = self._ct_arena
        if arena is None:
            arena = self._ct_arena = [b.allocate() for b in self._ct_buffers]
        executor = _PlanExecutor(self, env, arena)
        # Buffers a gradient may not take over, gathered before the backward frees any
        # value (an id freed meanwhile and reused only costs a copy).
        taken = {id(a) for a in env if type(a) is np.ndarray}
        assert self._arena is not None  # allocated by the forward
        taken.update(id(a) for a in self._arena)
        taken.update(id(a) for a in arena)
        param_of = self._param_of

        def ready(leaf: Any, ct: Any) -> None:
            # Each parameter's gradient is final at its leaf's step: hand it over now,
            # so gradient-ready hooks (an allreduce) overlap the rest of the backward.
            p = param_of[id(leaf)]
            _accumulate(p, ct, taken)
            hooks.gradient_ready(p)

        run_schedule(self._schedules[executor.fused], [(self._loss_node, np.ones_like(loss))],
                     executor, release=True, on_result=ready)
        self._write_state(env)  # after backward, which may read the buffers' old values
        if self.single:
            return wrap(loss, None)
        return (wrap(loss, None),) + tuple(wrap(env[v.index], None)
                                            for v in self.graph.outputs[1:])

    @staticmethod
    def _load(node: Node, reads: tuple, env: list, out: Var) -> None:
        """Give a backward step's node the values its rule reads from the cache."""
        inputs, fill, convert, saves_output = reads
        if fill:
            values = list(inputs)
            for i, slot in fill:
                values[i] = env[slot]
            inputs = tuple(values)
            if convert:
                inputs = saved_as_float(inputs, out.dtype)
        node.inputs = inputs
        node.output = env[out.index] if saves_output else None

    def _explain_backward(self) -> list[str]:
        lines = ["backward:"]
        for (eqn, _, saved, _, frees), b in zip(self._backward, self._ct_owner):
            reads = ", ".join(f"v{s}" for s in saved) or "nothing"
            kind = "backward kernel" if eqn.primitive.vjp is not None else (
                "transpose" if eqn.primitive.transpose is not None else "linearize+transpose")
            if eqn.out.index in self._folded_relus:
                kind = "folded into the max-pool after it: no work of its own"
            if eqn.out.index in self._folded_adds:
                by_relu = any(add is eqn for add in self._relu_bias.values())
                into = "the relu after it" if by_relu else "the max-pool after its relu"
                kind = f"folded into {into}: no work of its own"
            if eqn.out.index in self._folded_products:
                kind = "folded into the bias add after it: no work of its own"
            if eqn.out.index in self._matmul_bias:
                graded = [f"{a!r}'s" for a in self._matmul_bias[eqn.out.index].product.args
                          if isinstance(a, Var) and a.index in self._active]
                kind += (f", the product before it folded in: {' and '.join(graded)} "
                         f"gradient{'s' if len(graded) > 1 else ''} and the bias's in one "
                         f"step")
            if eqn.out.index in self._relu_bias:
                maps, bias = self._relu_bias[eqn.out.index].args
                kind += (f", the bias add before it folded in: straight to {maps!r}, "
                         f"{bias!r} summed per channel")
            if eqn.out.index in self._pool_bias:
                maps, bias = self._pool_bias[eqn.out.index].args
                kind += (f", the relu and the bias add before it folded in: straight to "
                         f"{maps!r}, {bias!r} summed per channel")
            elif eqn.out.index in self._pool_relu:
                target = self._pool_relu[eqn.out.index]
                kind += f", the relu before it folded in: straight to {target!r}"
            if b >= 0:
                order = " (by columns)" if self._ct_buffers[b].order == "F" else ""
                fold = self._matmul_bias.get(eqn.out.index)
                whose = "its first operand's" if fold is None else \
                    f"{fold.product.args[0]!r}'s"
                kind += f", {whose} gradient into buffer g{b}{order}"
            lines.append(f"       d {eqn.out!r} via {eqn.primitive.name} ({kind}); reads {reads}"
                         + (f"; frees {', '.join(f'v{s}' for s in frees)}" if frees else ""))
        saved = [s for s in sorted(self._saved)
                 if self.graph.vars[s].kind == "value" and s not in self._views]
        total = sum(self._bytes(s) for s in saved)
        if self._ct_buffers:
            lines.append(f"gradient buffers: {len(self._ct_buffers)} preallocated ("
                         f"{_fmt_bytes(sum(b.nbytes for b in self._ct_buffers))}), reused "
                         f"across calls by {sum(b >= 0 for b in self._ct_owner)} steps")
        lines.append("saved activations: " + (", ".join(
            f"v{s} {_fmt_bytes(self._bytes(s))}" for s in saved) or "none")
            + f" (total {_fmt_bytes(total)})")
        return lines

    def peak_bytes(self) -> int:
        peak, live = self._forward_memory()
        for eqn, _, _, _, frees in self._backward:
            # a cotangent of each operand appears while the saved values are still held
            grads = sum(a.nbytes for a in eqn.args if isinstance(a, Var) and a.kind == "value")
            peak = max(peak, live + grads)
            live -= sum(self._bytes(s) for s in frees)
        return peak


class _PlanExecutor(EagerExecutor):
    """How a training plan runs the core's backward schedule on one call: each step
    reads its values from the activation cache, writes its first operand's gradient
    into a buffer or runs the backend's fused kernel where it can (the core's
    linearize-then-transpose otherwise), and the cache lets go of each value as soon
    as the last step that reads it is done."""

    def __init__(self, plan: TrainingPlan, env: list, arena: list):
        super().__init__()
        self.plan, self.env, self.arena = plan, env, arena
        # ids of buffers that hold the cotangent of the one value their step wrote it for,
        # not yet handed to that value's own step: parts of that cotangent may be added
        # into them in place (its step may pass it on to several values after).
        self.summing: set[int] = set()

    def add_operands(self, a: Any, b: Any) -> Any:
        if (type(a) is np.ndarray and type(b) is np.ndarray and a.shape == b.shape
                and a.dtype == b.dtype and (id(a) in self.summing or id(b) in self.summing)):
            # Into the buffer: a fresh array would page-fault in (addition commutes, so
            # the sum is the same either way round).
            into, other = (a, b) if id(a) in self.summing else (b, a)
            return np.add(into, other, out=into)
        return super().add_operands(a, b)

    def linearize_recorded_graph(self, node: Any) -> int:  # type: ignore[override]  # a step's index
        return self.plan._step_of[id(node)]  # the step does its own work, from the cache

    def run_transposed_linear(self, linearization: Any, ct: Any) -> tuple:
        plan, env, backend, fused = self.plan, self.env, self.backend, self.fused
        k = linearization
        self.summing.discard(id(ct))  # its value's step: from here it may go several ways
        eqn, node, _, reads, _ = plan._backward[k]
        if plan._traced_params[k]:  # parameters computed from this call's inputs
            node.params = resolve_params(eqn.params, env)
        bias_grad = None
        if fused and eqn.out.index in plan._pool_relu:  # relu's backward folded in:
            # relu's own backward on the pooled maxima, one pass, its NaN rule.
            assert isinstance(backend, BackwardOps)  # as `fused` says
            ct = backend.relu_backward(ct, env[eqn.out.index])
            add = plan._pool_bias.get(eqn.out.index)
            if add is not None:  # and the bias add before the relu: the pool routes each
                # masked value to one position of the maps, so their sums are its sums
                bias_grad = backend.sum_to_shape(ct, add.args[1].shape)
        plan._load(node, reads, env, eqn.out)
        writer = plan._ct_writers[k]
        try:
            if fused and eqn.out.index in plan._relu_bias:  # the bias add before it folded in
                assert isinstance(backend, BackwardOps)  # as `fused` says
                owner = plan._ct_owner[k]
                buffer = self.arena[owner] if owner >= 0 and backend.runs_plan_kernels() \
                    else None
                grads = backend.relu_bias_backward(
                    ct, node.output, plan._relu_bias[eqn.out.index].args[1].shape, out=buffer)
                if buffer is not None and grads[0] is buffer:
                    self.summing.add(id(buffer))
                return grads
            if fused and eqn.out.index in plan._matmul_bias:  # the product before it
                return self._matmul_bias(k, plan._product_step[eqn.out.index], ct,
                                         node.parents[1] is not None)
            if writer is not None and fused and backend.runs_plan_kernels():
                # The same kernel, its first operand's gradient into a buffer.
                buffer = self.arena[plan._ct_owner[k]]
                grads = writer(backend, ct, node, buffer)
                if sum(g is buffer for g in grads) == 1:
                    self.summing.add(id(buffer))
            elif fused and eqn.primitive.vjp is not None:
                # The backend's kernel, straight from the cache: no linearization.
                grads = eqn.primitive.vjp(backend, ct, node)
            else:
                grads = super().run_transposed_linear(super().linearize_recorded_graph(node), ct)
            return grads if bias_grad is None else (grads[0], bias_grad)
        except DerivativeError as err:
            raise PlanDerivativeError(f"plan: {err}") from None
        finally:
            node.inputs = node.output = None
            node.params = eqn.params

    def _matmul_bias(self, k: int, product: int, ct: Any, bias_needed: bool) -> tuple:
        """Bias add step `k`, which took in step `product`, of the product before it:
        the product's operands' gradients (the first into step k's buffer, if it has
        one) and the bias's, from the product step's reads."""
        plan, backend = self.plan, self.backend
        assert isinstance(backend, BackwardOps)  # only fused schedules fold
        owner = plan._ct_owner[k]
        buffer = self.arena[owner] if owner >= 0 and backend.runs_plan_kernels() else None
        eqn, node, _, reads, _ = plan._backward[product]
        plan._load(node, reads, self.env, eqn.out)
        try:
            # An operand not kept (its own gradient is not needed) is a zero-stride
            # stand-in of its shape, as matmul's own backward step passes it.
            lhs, rhs = (backend.broadcast_to(backend.zeros((), node.dtype), shape)
                        if v is None else v for v, shape in zip(node.inputs, node.in_shapes))
            grads = backend.matmul_bias_backward(
                ct, lhs, rhs, needed=(node.parents[0] is not None,
                                      node.parents[1] is not None, bias_needed), out=buffer)
            if buffer is not None and grads[0] is buffer:
                self.summing.add(id(buffer))
            return grads
        finally:
            node.inputs = node.output = None

    def release_saved(self, node: Any) -> None:
        env = self.env
        for s in self.plan._backward[self.plan._step_of[id(node)]][4]:
            env[s] = None  # the activation cache lets go as soon as it can
