"""What a plan was traced under, and the plans traced again when that changes.

A plan is a trace of its function under one signature: the shapes and dtypes of
its inputs, the train/eval mode (`training`) of every module the function closes
over, and the identity of every parameter those modules hold (and of every tensor
that requires grad in the function's closure cells or in the globals it names).
Called under another signature (a last partial batch, `model.eval()`,
`model.fc.weight = nn.Parameter(...)`), it traces the function again rather than
run stale, and keeps the plans of the last `CACHE_SIZE` signatures (least
recently used dropped first), as ONNX models do for shapes.

Modules are recognised by their shape (a `training` flag, `_parameters` and
`_modules` dicts), since this layer lies below `pullback.nn`. They are found
where a function reaches them: the compiled object itself, a bound method's
`__self__`, the static example arguments, the function's closure cells and the
globals its code names (followed into the functions found there), in lists,
tuples and dicts, and every module below those.
"""

from __future__ import annotations

import threading
import types
from collections import OrderedDict
from collections.abc import Callable, Hashable
from itertools import chain
from operator import itemgetter, methodcaller
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .plan import Plan

CACHE_SIZE = 8  # plans kept per compiled function, one per signature
_TRAINING = itemgetter("training")
_VALUES = methodcaller("values")


def _is_module(obj: Any) -> bool:
    d = getattr(obj, "__dict__", None)
    return (isinstance(d, dict) and isinstance(d.get("_parameters"), dict)
            and isinstance(d.get("_modules"), dict) and "training" in d)


def _requires_grad(obj: Any) -> bool:
    return getattr(obj, "requires_grad", False) is True and hasattr(obj, "_data")


class _Reach:
    """The modules, and the closure cells and globals holding tensors that require grad,
    that a function reaches."""

    def __init__(self) -> None:
        self.modules: list[Any] = []
        self.cells: list[Any] = []
        self.globals: list[tuple[dict, str]] = []  # (a function's globals, a name in them)
        self._seen: set[int] = set()

    def visit(self, obj: Any, depth: int = 0) -> None:
        if id(obj) in self._seen or depth > 6:
            return
        self._seen.add(id(obj))
        if _is_module(obj):
            self._module(obj)
        elif isinstance(obj, types.MethodType):
            self.visit(obj.__self__, depth + 1)
            self.visit(obj.__func__, depth + 1)
        elif isinstance(obj, types.FunctionType):
            self._function(obj, depth)
        elif isinstance(obj, (list, tuple)) and depth < 6:
            for item in obj[:64]:
                if _is_module(item) or isinstance(item, (types.FunctionType, list, tuple)):
                    self.visit(item, depth + 1)
        elif isinstance(obj, dict) and depth < 6:
            for item in list(obj.values())[:64]:
                if _is_module(item):
                    self.visit(item, depth + 1)

    def _module(self, module: Any) -> None:
        stack = [module]
        while stack:
            m = stack.pop()
            self.modules.append(m)
            for child in m.__dict__["_modules"].values():
                if id(child) not in self._seen and _is_module(child):
                    self._seen.add(id(child))
                    stack.append(child)

    def _function(self, fn: types.FunctionType, depth: int) -> None:
        for cell in fn.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not filled yet
                continue
            if _requires_grad(value):
                self.cells.append(cell)
            else:
                self.visit(value, depth + 1)
        names = fn.__code__.co_names
        found = fn.__globals__
        for name in names:
            value = found.get(name)
            if _requires_grad(value):
                self.globals.append((found, name))
            elif value is not None and not isinstance(value, types.ModuleType):
                self.visit(value, depth + 1)


class Retracer:
    """The plans of one compiled function, one per signature (at most `CACHE_SIZE`)."""

    def __init__(self, fn: Callable[..., object], example_inputs: tuple[object, ...],
                 lower: Callable[[tuple[object, ...]], Plan[Any]]) -> None:
        self.fn = fn
        self.examples = example_inputs
        self.tensor_positions = [i for i, x in enumerate(example_inputs)
                                 if hasattr(x, "shape") and hasattr(x, "dtype")]
        self._lower = lower  # examples -> a plan
        reach = _Reach()
        reach.visit(fn)
        for x in example_inputs:
            if not hasattr(x, "shape"):
                reach.visit(x)
        self.modules = reach.modules
        self._found = [m.__dict__ for m in self.modules]  # their attribute dicts
        self._param_dicts = [d["_parameters"] for d in self._found]
        self.cells, self.globals = reach.cells, reach.globals
        self.plans: OrderedDict[tuple[Hashable, ...], Plan[Any]] = OrderedDict()
        self.traces = 0
        self._lock = threading.Lock()  # threads calling one plan share its cache

    def signature(self, arrays: list[Any]) -> tuple[Hashable, ...]:
        """What a plan depends on beyond its graph: input shapes and dtypes, modules'
        modes, and parameters' identities."""
        # Read at every call, so in C loops (map) over what compile time found.
        return (tuple([(a.shape, a.dtype) for a in arrays]),
                tuple(map(_TRAINING, self._found)),
                tuple(map(id, chain.from_iterable(map(_VALUES, self._param_dicts)))),
                tuple([id(c.cell_contents) for c in self.cells]) if self.cells else (),
                tuple([id(g.get(n)) for g, n in self.globals]) if self.globals else ())

    def first(self) -> Plan[Any]:
        """The plan traced on the examples at compile time."""
        plan = self._trace(self.examples)
        arrays = [self.examples[i] for i in self.tensor_positions]
        self.plans[self.signature(arrays)] = plan
        return plan

    def plan_for(self, inputs: tuple[object, ...], current: Plan[Any]) -> Plan[Any]:
        """The plan for these inputs under the current modes and parameters: `current`
        when it fits, a cached one, or one traced now."""
        arrays = [x for x in inputs if hasattr(x, "shape")]
        if len(arrays) != len(self.tensor_positions):
            return current  # refused by the plan, with the counts
        key = self.signature(arrays)
        with self._lock:
            return self._plan(key, inputs, arrays)

    def _plan(self, key: tuple[Hashable, ...], inputs: tuple[object, ...], arrays: list[Any]
              ) -> Plan[Any]:
        plans = self.plans
        plan = plans.get(key)
        if plan is not None:
            plans.move_to_end(key)
            return plan
        if len(inputs) == len(self.examples):
            examples = inputs
        else:  # the tensors only, in the tensor examples' places
            filled = list(self.examples)
            for i, x in zip(self.tensor_positions, arrays):
                filled[i] = x
            examples = tuple(filled)
        plan = self._trace(tuple(examples))
        plans[key] = plan
        while len(plans) > CACHE_SIZE:
            plans.popitem(last=False)
        return plan

    def _trace(self, examples: tuple[object, ...]) -> Plan[Any]:
        plan = self._lower(examples)
        plan._retracer = self
        self.traces += 1
        return plan
