"""Modules made of modules: Sequential, Residual, LR, each tracing and backpropagating
by composing its children's traced forwards and backprops; and ModuleDict, which
only holds children by name (it has no forward, as PyTorch's)."""

from __future__ import annotations

import math
import numbers
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .. import ops, optim
from ..ops.hints import TensorLike
from ..tensor import Tensor
from ..tensor.eager import wrap
from .module import GradTree, GraphTrace, Module


def _data(x: TensorLike | None) -> NDArray[Any]:
    return x._data if isinstance(x, Tensor) else np.asarray(x)


class LayerTrace:
    """A container's trace: the module and its children's traces."""

    def __init__(self, module: Module, *saved: object) -> None:
        self.module = module
        self.saved = saved


def _own_trace(module: Module, trace: object) -> tuple[Any, ...]:
    if not isinstance(trace, LayerTrace) or trace.module is not module:
        raise TypeError(f"backprop: the trace was not made by this {type(module).__name__}'s "
                        "traced_forward")
    return trace.saved


class Sequential(Module):
    """Children applied in order, named "0", "1", ... Given as arguments
    (`Sequential(a, b)`), or as one tuple or list of them (`Sequential((a, b))`)."""

    def __init__(self, *modules: Module | Iterable[Module]) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (tuple, list)):
            modules = tuple(modules[0])
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"Sequential: item {i} is a {type(m).__name__}, not a Module")
            setattr(self, str(i), m)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, index: int) -> Module:
        return list(self._modules.values())[index]

    def forward(self, x: TensorLike) -> Tensor:
        h: Any = x  # each child's output is the next one's input, whatever it is
        for m in self._modules.values():
            h = m(h)
        out: Tensor = h  # a Sequential chains layers from tensors to tensors
        return out

    def traced_forward(self, x: TensorLike) -> tuple[Tensor, object]:
        if _traced_by_graph(self):
            # Each child's trace would be its own part of the recorded graph: one graph
            # for the whole chain takes one backward pass where a trace per child takes
            # one pass (and one copy of the saved parameters) per child.
            return super().traced_forward(x)
        traces = []
        h: Any = x  # each child's traced output is the next one's input
        for m in self._modules.values():
            h, trace = m.traced_forward(h)
            traces.append(trace)
        out: Tensor = h
        return out, LayerTrace(self, traces)

    def backprop(self, trace: object, grad_output: TensorLike) -> tuple[Tensor | None, GradTree]:
        if isinstance(trace, GraphTrace):
            return super().backprop(trace, grad_output)
        (traces,) = _own_trace(self, trace)
        grads: GradTree = {}
        # None past a child whose input takes no gradient (ids), which only the first can be.
        g: Any = grad_output
        for (name, m), t in reversed(list(zip(self._modules.items(), traces))):
            g, child_grads = m.backprop(t, g)
            if child_grads:
                grads[name] = child_grads
        return g, dict(reversed(list(grads.items())))


def _traced_by_graph(module: Module) -> bool:
    """Whether `module`'s trace is the recorded graph all through: Module's own
    traced_forward and backprop, or a Sequential of such modules."""
    cls = type(module)
    if cls.traced_forward is Sequential.traced_forward and cls.backprop is Sequential.backprop:
        return all(_traced_by_graph(m) for m in module._modules.values())
    return cls.traced_forward is Module.traced_forward and cls.backprop is Module.backprop


class Residual(Module):
    """y = x + module(x)."""

    module: Module

    def __init__(self, module: Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: TensorLike) -> Tensor:
        return ops.add(x, self.module(x))

    def traced_forward(self, x: TensorLike) -> tuple[Tensor, object]:
        y, trace = self.module.traced_forward(x)
        return wrap(ops.add(_data(x), _data(y))._data, None), LayerTrace(self, trace)

    def backprop(self, trace: object, grad_output: TensorLike) -> tuple[Tensor, GradTree]:
        (inner,) = _own_trace(self, trace)
        grad_inner, grads = self.module.backprop(inner, grad_output)
        grad_x = ops.add(_data(grad_output), _data(grad_inner))
        return wrap(grad_x._data, None), ({"module": grads} if grads else {})


class LR(Module):
    """Wraps a module so that its parameters' updates are exactly `scale` times what
    they would be (a per-module learning-rate multiplier, applied by every applyer).

    The scale is the wrapper's, read at each update: nested wrappers multiply
    (`LR(LR(m, 0.5), 0.5)` scales by 0.25), and dropping the wrapper restores
    the module's own updates; nothing is written onto the parameters."""

    module: Module
    scale: float

    def __init__(self, module: Module, scale: float) -> None:
        super().__init__()
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) \
                or not 0 <= scale < math.inf:
            raise ValueError(f"LR: scale must be a finite number >= 0, not {scale!r}")
        self.module = module
        self.scale = scale
        optim.scale_updates(self)

    def forward(self, x: TensorLike) -> Tensor:
        y: Tensor = self.module(x)  # wrapped, as in Sequential, is a layer of tensors
        return y

    def traced_forward(self, x: TensorLike) -> tuple[Tensor, object]:
        y, trace = self.module.traced_forward(x)
        return y, LayerTrace(self, trace)

    def backprop(self, trace: object, grad_output: TensorLike) -> tuple[Tensor | None, GradTree]:
        (inner,) = _own_trace(self, trace)
        grad_x, grads = self.module.backprop(inner, grad_output)
        return grad_x, ({"module": grads} if grads else {})

    def extra_repr(self) -> str:
        return f"scale={self.scale}"


class ModuleDict(Module):
    """Modules by name, as PyTorch's ModuleDict: registered children in insertion order,
    so the state dict names their parameters "name.weight"; `md[name]`,
    `md[name] = module`, `del md[name]`, `in`, `len`, iteration over the names,
    `keys()`, `values()`, `items()`, `update()`, `pop()` and `clear()`."""

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None
                 ) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def _check_key(self, key: object) -> str:
        if not isinstance(key, str):
            raise TypeError(f"ModuleDict: keys are strings, not {type(key).__name__}")
        if not key or "." in key:
            raise KeyError(f"ModuleDict: key {key!r} must be a non-empty name without '.'")
        if key not in self._modules and hasattr(self, key):
            raise KeyError(f"ModuleDict: key {key!r} would hide the attribute of that name")
        return key

    def __getitem__(self, key: str) -> Module:
        if key not in self._modules:
            raise KeyError(f"ModuleDict: no module named {key!r}; it has {list(self._modules)}")
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"ModuleDict: {key!r} must be a Module, not {type(module).__name__}")
        setattr(self, self._check_key(key), module)

    def __delitem__(self, key: str) -> None:
        self.pop(key)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: object) -> bool:
        return key in self._modules

    def keys(self) -> KeysView[str]:
        return self._modules.keys()

    def values(self) -> ValuesView[Module]:
        return self._modules.values()

    def items(self) -> ItemsView[str, Module]:
        return self._modules.items()

    # dict's update, as PyTorch's ModuleDict has it, in place of Module.update(applyer,
    # grads) of the explicit path, which a ModuleDict (it has no forward) does not take.
    def update(  # type: ignore[override]
            self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        pairs = modules.items() if isinstance(modules, Mapping) else modules
        for entry in pairs:
            try:
                key, module = entry
            except (TypeError, ValueError):
                raise TypeError(f"ModuleDict.update: expected (name, module) pairs, got "
                                f"{entry!r}") from None
            self[key] = module

    def pop(self, key: str) -> Module:
        module = self[key]
        del self._modules[key]
        object.__delattr__(self, key)
        return module

    def clear(self) -> None:
        for key in list(self._modules):
            self.pop(key)
