"""`Module`: parameters, children, state dicts, and the explicit training path.

A module's traced forward returns its output and a trace; `backprop(trace,
grad_output)` returns the input gradient and the module's own gradients (a
tree shaped like its parameters) without mutating anything; `update(applyer,
grads)` applies them. The default trace is the graph the autodiff core
records; layers may provide their own by composition.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import optim
from ..ad import Leaf, backward_pass
from ..tensor import Tensor, enable_grad
from ..tensor.backward import EagerExecutor, initial_cotangent, owned
from ..tensor.eager import wrap
from .snapshot import own_saved_parameters
from .state import state_dict_mismatch


class NoGradientError(RuntimeError):
    """Backprop found parameters that the output does not depend on."""


def Parameter(data: Any, name: str | None = None) -> Tensor:
    """A trainable tensor: a leaf that requires grad (a plain `Tensor`)."""
    t = data if isinstance(data, Tensor) else Tensor(data)
    t.requires_grad = True
    if name is not None:
        t._node.name = name
    return t


class Module:
    """Base class of layers and models: register tensors that require grad, child
    modules and lists of modules as attributes, and define `forward`."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise RuntimeError(f"{type(self).__name__}: call super().__init__() before "
                               "assigning attributes")
        for registry in (self._parameters, self._buffers, self._modules):
            registry.pop(name, None)
        if isinstance(value, Tensor) and value.requires_grad:
            if not value.is_leaf:
                raise ValueError(f"{type(self).__name__}.{name}: a parameter must be a leaf "
                                 "tensor (one not computed from others); use .detach()")
            self._parameters[name] = value
            value._node.name = name  # named for errors; parents prefix their own names
        elif isinstance(value, Module):
            self._modules[name] = value
            _prefix_names(value, name)
        elif isinstance(value, (list, tuple)) and value and all(
                isinstance(m, Module) for m in value):
            value = ModuleList(value)
            self._modules[name] = value
            _prefix_names(value, name)
        object.__setattr__(self, name, value)

    def register_buffer(self, name: str, value: Any) -> None:
        """A tensor that is part of the state dict but is not trained."""
        value = value if isinstance(value, Tensor) else Tensor(value)
        object.__setattr__(self, name, value)
        self._buffers[name] = value

    # ------------------------------------------------------------ the tree

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield from self._modules.items()

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """Each parameter once, with its dotted name, in registration order."""
        seen: set[int] = set()
        for name, p in self._named("_parameters", prefix):
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p

    def parameters(self) -> list[Tensor]:
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        yield from self._named("_buffers", prefix)

    def _named(self, kind: str, prefix: str) -> Iterator[tuple[str, Tensor]]:
        for name, value in getattr(self, kind).items():
            yield prefix + name, value
        for name, child in self._modules.items():
            yield from child._named(kind, f"{prefix}{name}.")

    def state_dict(self) -> dict[str, Tensor]:
        """Parameters and buffers by dotted name (the `named_parameters()` names)."""
        state = dict(self.named_parameters())
        state.update(self.named_buffers())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy values into the parameters and buffers; names, shapes and dtypes must
        match exactly (every problem is listed in one error)."""
        own = self.state_dict()
        message = state_dict_mismatch(
            {name: (t.shape, t.dtype) for name, t in own.items()},
            {name: np.asarray(value) for name, value in state.items()},
            what=f"load_state_dict: {type(self).__name__}",
        )
        if message is not None:
            raise ValueError(message)
        for name, target in own.items():
            target._check_writeable("load_state_dict")
            np.copyto(target._data, np.asarray(state[name]))

    def train(self, mode: bool = True) -> Module:
        object.__setattr__(self, "training", mode)
        for child in self._modules.values():
            child.train(mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    # ------------------------------------------------------------ running

    def forward(self, x: Any) -> Any:
        raise TypeError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def traced_forward(self, x: Any) -> tuple[Tensor, Any]:
        """`(output, trace)`: the output and what `backprop` needs (here, the recorded graph).

        The output is a value cut from that graph, as the trace alone is what `backprop`
        differentiates: a loss computed from it (by `pb.vjp`, say) is then a first-order
        computation of its own, not one nested inside the module's recording."""
        data = x._data if isinstance(x, Tensor) else np.asarray(x)
        if data.dtype.kind != "f":
            # An integer input (token ids, indices) gets no gradient; the parameters do.
            with enable_grad():
                y = self(wrap(data, None))
            return _value(y), GraphTrace(self, None, y)
        traced = wrap(data, None)
        traced._node = Leaf(data.shape, data.dtype, None, "input")
        with enable_grad():
            y = self(traced)
        return _value(y), GraphTrace(self, traced, y)

    def backprop(self, trace: Any, grad_output: Any) -> tuple[Tensor | None, dict]:
        """`(grad_input, grads)` from the output's gradient; mutates nothing, so the
        same trace may be backpropagated again. `grads` mirrors the parameter tree."""
        if not isinstance(trace, GraphTrace) or trace.module is not self:
            raise TypeError(f"backprop: the trace was not made by this {type(self).__name__}'s "
                            "traced_forward")
        return trace.backprop(grad_output)

    def update(self, applyer: optim.GradApplyer, grads: dict) -> None:
        """Apply gradients (a tree as `backprop` returns) through a gradient applyer."""
        flat = flatten_tree(grads)
        pairs, missing = [], []
        for name, p in self.named_parameters():
            if name in flat:
                pairs.append((p, flat.pop(name)))
            else:
                missing.append(name)
        if missing or flat:
            raise ValueError(f"update: {type(self).__name__}: gradients missing for "
                             f"{missing or 'none'}; unknown names {sorted(flat) or 'none'}")
        applyer.apply(pairs)

    def new_momentum(self, params: optim.TrainParams, momentum_coefficient: float) -> Any:
        """An SGD-with-momentum applyer over this module's parameters."""
        return optim.SGD(self.parameters(), params, momentum=momentum_coefficient)

    def new_rmsprop(self, params: optim.TrainParams, beta: float) -> Any:
        return optim.RMSProp(self.parameters(), params, beta=beta)

    def new_rmsprop_with_momentum(self, params: optim.TrainParams, momentum_coefficient: float,
                                  beta: float) -> Any:
        return optim.RMSProp(self.parameters(), params, beta=beta,
                             momentum=momentum_coefficient)

    def __repr__(self) -> str:
        children = "".join(f"\n  ({n}): " + repr(m).replace("\n", "\n  ")
                           for n, m in self._modules.items())
        return f"{type(self).__name__}({self.extra_repr()}{children}{chr(10) if children else ''})"

    def extra_repr(self) -> str:
        return ""


def _value(y: Any) -> Any:
    """The traced output without its recorded graph (which the trace keeps)."""
    return wrap(y._data, None) if isinstance(y, Tensor) else y


def _prefix_names(child: Module, name: str) -> None:
    """A child's parameters take its attribute name as a prefix: "0.weight"."""
    for p in child.parameters():
        leaf = p._node
        if leaf is not None and leaf.primitive is None:
            leaf.name = f"{name}.{leaf.name}" if leaf.name else name


class ModuleList(Module):
    """A list of modules registered as children "0", "1", ..."""

    def __init__(self, modules: Any = ()):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, index: int) -> Module:
        return list(self._modules.values())[index]


class GraphTrace:
    """The default trace: the graph recorded during the forward, kept until dropped."""

    def __init__(self, module: Module, traced_input: Tensor | None, output: Tensor | None):
        self.module = module
        self.input = traced_input
        self.output = output
        # The trace keeps the parameter values it was made with, so that `update` may
        # write the parameters while it is alive (and a second backprop still agrees).
        own_saved_parameters(output, module.parameters())

    def backprop(self, grad_output: Any) -> tuple[Tensor | None, dict]:
        params = list(self.module.named_parameters())
        targets = [p._node for _, p in params]
        if self.input is not None:
            targets.append(self.input._node)
        out = self.output
        results: dict = {}
        if out is not None and out._node is not None:
            ct = initial_cotangent("backprop", out, grad_output)
            ct = ct._data if isinstance(ct, Tensor) else ct
            results = backward_pass([(out._node, ct)], EagerExecutor(), targets=targets)
        ungraded = [f"{n} {p.shape}" for n, p in params if p._node not in results]
        if ungraded:
            raise NoGradientError(
                f"backprop: {type(self.module).__name__}: parameters got no gradient (the "
                f"output does not depend on them): {', '.join(ungraded)}"
            )
        given = (grad_output._data if isinstance(grad_output, Tensor) else grad_output,)
        arrays = owned([results[p._node] for _, p in params] + [
            results.get(self.input._node) if self.input is not None else None], given)
        grads = unflatten_tree({n: wrap(a, None) for (n, _), a in zip(params, arrays)})
        grad_input = None
        if self.input is not None:
            g = arrays[-1]
            grad_input = wrap(g if g is not None else np.zeros_like(self.input._data), None)
        return grad_input, grads


def flatten_tree(tree: dict, prefix: str = "") -> dict:
    """{"0": {"weight": g}} -> {"0.weight": g}."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten_tree(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def unflatten_tree(flat: dict) -> dict:
    """{"0.weight": g} -> {"0": {"weight": g}}: gradients shaped like the parameter tree."""
    tree: dict = {}
    for name, value in flat.items():
        node = tree
        *parents, leaf = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree
