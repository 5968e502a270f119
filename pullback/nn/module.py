"""`Module`: parameters, children, state dicts, and the explicit training path.

A module's traced forward returns its output and a trace; `backprop(trace,
grad_output)` returns the input gradient and the module's own gradients (a
tree shaped like its parameters) without mutating anything; `update(applyer,
grads)` applies them. The default trace is the graph the autodiff core
records; layers may provide their own by composition.

Types: calling a module runs its `forward`, and `Module.__call__` says so to type
checkers: its `self` is typed by a protocol of `forward`'s signature (a ParamSpec and
the return type), so `Dense(4, 2)(x)` is checked against `Dense.forward` and is a
`Tensor`, `LSTM(...)(x)` is LSTM's tuple, and a module known only as `Module` gives
`Any` (its forward may return anything). Each layer types its own `forward`; nothing
else needs declaring, no generic parameters and no casts at call sites, and a
layer's forward returning a child's output keeps `warn_return_any` quiet when the
child's type is known. Containers (`Sequential`, `Residual`, `LR`) chain modules
from tensors to tensors, what their traced forward and backprop need: their
forwards say `Tensor`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, NamedTuple, ParamSpec, Protocol, TypeVar, Union

import numpy as np

from .. import optim
from ..ad import Leaf, backward_pass
from ..ops.hints import DTypeLike, TensorLike
from ..tensor import Tensor, enable_grad, float32, float64
from ..tensor.backward import EagerExecutor, initial_cotangent, owned
from ..tensor.eager import wrap
from .snapshot import own_saved_parameters
from .state import state_dict_mismatch

# Gradients as `backprop` returns them: shaped like the parameter tree, by attribute name
# ({"0": {"weight": g, "bias": g}}).
GradTree = dict[str, Union[Tensor, "GradTree"]]

_P = ParamSpec("_P")
_R = TypeVar("_R", covariant=True)
_T = TypeVar("_T")
_M = TypeVar("_M", bound="Module")
_Item = TypeVar("_Item", bound="Module")


class _Forward(Protocol[_P, _R]):
    """What `Module.__call__` reads of its module: `forward`'s parameters and result."""

    def forward(self, *args: _P.args, **kwargs: _P.kwargs) -> _R: ...


class NoGradientError(RuntimeError):
    """Backprop found parameters that the output does not depend on."""


class IncompatibleKeys(NamedTuple):
    """What `load_state_dict` did not match, as PyTorch's `_IncompatibleKeys`."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def Parameter(data: TensorLike, name: str | None = None) -> Tensor:
    """A trainable tensor: a leaf that requires grad (a plain `Tensor`)."""
    t = data if isinstance(data, Tensor) else Tensor(data)
    t.requires_grad = True
    if name is not None and isinstance(t._node, Leaf):  # requiring grad made it a leaf
        t._node.name = name
    return t


class Module:
    """Base class of layers and models: register tensors that require grad, child
    modules and lists of modules as attributes, and define `forward`."""

    # Set by __init__ (through object.__setattr__, past the registering __setattr__).
    _parameters: dict[str, Tensor]
    _buffers: dict[str, Tensor]
    _modules: dict[str, Module]
    training: bool

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
            if isinstance(value._node, Leaf):  # as it is: a leaf that requires grad
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

    def register_buffer(self, name: str, value: TensorLike) -> None:
        """A tensor that is part of the state dict but is not trained."""
        value = value if isinstance(value, Tensor) else Tensor(value)
        object.__setattr__(self, name, value)
        self._buffers[name] = value

    # ------------------------------------------------------------ the tree

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """Each direct child once, with its attribute name."""
        seen: set[int] = set()
        for name, child in self._modules.items():
            if id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> Iterator[Module]:
        for _, child in self.named_children():
            yield child

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module ("" or `prefix`) and every module below it, each once, with its
        dotted name, parents before children (as PyTorch's)."""
        seen: set[int] = set()
        stack = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield name, module
            stack.extend(reversed([(f"{name}.{n}" if name else n, m)
                                   for n, m in module._modules.items()]))

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    def apply(self: _M, fn: Callable[[Module], object]) -> _M:
        """`fn(m)` for every child module, recursively, then for this one (as PyTorch's,
        e.g. to initialize weights); returns this module."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

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

    def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """Parameters and buffers by dotted name, as PyTorch lays them out: each module's
        own parameters, then its buffers, then its children's; a module or parameter
        reached by two names (tied weights) is listed under both."""
        state: dict[str, Tensor] = {}
        self._collect_state(prefix, state)
        return state

    def _collect_state(self, prefix: str, state: dict[str, Tensor]) -> None:
        for registry in (self._parameters, self._buffers):
            for name, value in registry.items():
                state[prefix + name] = value
        for name, child in self._modules.items():
            child._collect_state(f"{prefix}{name}.", state)

    def load_state_dict(self, state: Mapping[str, TensorLike],
                        strict: bool = True) -> IncompatibleKeys:
        """Copy values into the parameters and buffers; shapes and dtypes must match
        exactly, and with `strict` so must the names (every problem is listed in one
        error, and nothing is written unless all fit). Without `strict`, the names
        that match are loaded; returns the missing and unexpected names."""
        own = self.state_dict()
        given = {name: np.asarray(value) for name, value in state.items()}
        missing = [name for name in own if name not in given]
        unexpected = [name for name in given if name not in own]
        expected = {name: (t.shape, t.dtype) for name, t in own.items()
                    if strict or name in given}
        message = state_dict_mismatch(
            expected, given if strict else {n: v for n, v in given.items() if n in own},
            what=f"load_state_dict: {type(self).__name__}",
        )
        if message is not None:
            raise ValueError(message)
        targets = [(own[name], value) for name, value in given.items() if name in own]
        for target, _ in targets:
            target._check_writeable("load_state_dict")
        for target, value in targets:
            np.copyto(target._data, value)
        return IncompatibleKeys(missing, unexpected)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget every parameter's gradient (`p.grad = None`, PyTorch's default), or
        with `set_to_none=False` fill the existing gradients with zeros."""
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad._check_writeable("zero_grad")
                p.grad._data.fill(0)

    def to(self: _M, *args: DTypeLike, dtype: DTypeLike | None = None,
           device: str | None = None) -> _M:
        """Convert the parameters, their gradients and the float buffers to a float
        dtype in place (integer buffers such as counts stay as they are), as
        PyTorch's: `to(pb.float64)`, `to("float64")`, `to(np.float64)`,
        `to(dtype=...)`; "cpu" as a device is accepted (pullback runs there).

        Each parameter stays the same Tensor (optimizers and `nn.LR` know parameters
        by identity); its array is replaced by a converted copy, so NumPy views taken
        before (`p.numpy()`) keep the old values, and a plan compiled before the
        conversion should be compiled again. An optimizer converts a parameter's
        buffers to its new dtype at its next step. Returns this module."""
        for arg in args:
            if isinstance(arg, str) and arg.split(":")[0] in _DEVICES:
                device = arg
            elif dtype is None:
                dtype = arg
            else:
                raise TypeError(f"to: expected a dtype and/or the device 'cpu', got {args!r}")
        if device is not None and device != "cpu":
            raise ValueError(f"to: pullback runs on the CPU; device {device!r} is not available")
        if dtype is None:
            return self
        target = _float_dtype(dtype)
        # Each tensor once (tied weights are one), all checked before any is converted,
        # so that a refusal leaves the module whole.
        changing = list({id(t): t for t in self.state_dict().values()
                         if t.dtype.kind == "f" and t.dtype != target}.values())
        for t in changing:
            t._check_writeable("to")
        for t in changing:
            t._data = t._data.astype(target)
            if t._node is not None:
                t._node.dtype = target
            if t.grad is not None and t.grad.dtype != target:
                t.grad = Tensor(t.grad._data.astype(target))
        return self

    def train(self: _M, mode: bool = True) -> _M:
        object.__setattr__(self, "training", mode)
        for child in self._modules.values():
            child.train(mode)
        return self

    def eval(self: _M) -> _M:
        return self.train(False)

    # ------------------------------------------------------------ running

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """What the module computes; each layer defines its own. (Here, a module known
        only as a `Module` takes and returns anything.)"""
        raise TypeError(f"{type(self).__name__} does not define forward()")

    def __call__(self: _Forward[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """`forward(*args, **kwargs)`, typed as the module's own `forward`."""
        return self.forward(*args, **kwargs)

    def traced_forward(self, x: TensorLike) -> tuple[Tensor, object]:
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

    def backprop(self, trace: object, grad_output: TensorLike) -> tuple[Tensor | None, GradTree]:
        """`(grad_input, grads)` from the output's gradient; mutates nothing, so the
        same trace may be backpropagated again. `grads` mirrors the parameter tree."""
        if not isinstance(trace, GraphTrace) or trace.module is not self:
            raise TypeError(f"backprop: the trace was not made by this {type(self).__name__}'s "
                            "traced_forward")
        return trace.backprop(grad_output)

    def update(self, applyer: optim.GradApplyer, grads: GradTree) -> None:
        """Apply gradients (a tree as `backprop` returns) through a gradient applyer."""
        flat = flatten_tree(grads)
        pairs: list[tuple[Tensor, Tensor]] = []
        missing: list[str] = []
        for name, p in self.named_parameters():
            if name in flat:
                pairs.append((p, flat.pop(name)))
            else:
                missing.append(name)
        if missing or flat:
            raise ValueError(f"update: {type(self).__name__}: gradients missing for "
                             f"{missing or 'none'}; unknown names {sorted(flat) or 'none'}")
        applyer.apply(pairs)

    def new_momentum(self, params: optim.TrainParams, momentum_coefficient: float) -> optim.SGD:
        """An SGD-with-momentum applyer over this module's parameters."""
        return optim.SGD(self.parameters(), params, momentum=momentum_coefficient)

    def new_rmsprop(self, params: optim.TrainParams, beta: float) -> optim.RMSProp:
        return optim.RMSProp(self.parameters(), params, beta=beta)

    def new_rmsprop_with_momentum(self, params: optim.TrainParams, momentum_coefficient: float,
                                  beta: float) -> optim.RMSProp:
        return optim.RMSProp(self.parameters(), params, beta=beta,
                             momentum=momentum_coefficient)

    def __repr__(self) -> str:
        children = "".join(f"\n  ({n}): " + repr(m).replace("\n", "\n  ")
                           for n, m in self._modules.items())
        return f"{type(self).__name__}({self.extra_repr()}{children}{chr(10) if children else ''})"

    def extra_repr(self) -> str:
        return ""

    # Last in the class: below this, `float` in an annotation would name the method.
    def double(self: _M) -> _M:
        """`to(pb.float64)`."""
        return self.to(float64)

    def float(self: _M) -> _M:
        """`to(pb.float32)`."""
        return self.to(float32)


def _value(y: Any) -> Any:
    """The traced output without its recorded graph (which the trace keeps)."""
    return wrap(y._data, None) if isinstance(y, Tensor) else y


# Device names PyTorch code passes to `to`; only the CPU is pullback's.
_DEVICES = ("cpu", "cuda", "mps", "xpu", "meta")


def _float_dtype(dtype: DTypeLike) -> np.dtype[Any]:
    """`dtype` as float32 or float64, or a TypeError naming what `to` accepts."""
    resolved: np.dtype[Any] | None
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved is None or resolved not in (float32, float64):
        raise TypeError(f"to: a module converts to a float dtype (pb.float32, pb.float64, "
                        f"'float32', 'float64'), not {dtype!r}")
    return resolved


def _prefix_names(child: Module, name: str) -> None:
    """A child's parameters take its attribute name as a prefix: "0.weight"."""
    for p in child.parameters():
        leaf = p._node
        if isinstance(leaf, Leaf):
            leaf.name = f"{name}.{leaf.name}" if leaf.name else name


class ModuleList(Module, Generic[_Item]):
    """A list of modules registered as children "0", "1", ...; typed by its items
    (`ModuleList([Dense(...), ...])[0]` is a `Dense` to a type checker)."""

    def __init__(self, modules: Iterable[_Item] = ()) -> None:
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self) -> Iterator[_Item]:
        return iter(self._modules.values())  # type: ignore[arg-type]  # only _Item were added

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, index: int) -> _Item:
        return list(self._modules.values())[index]  # type: ignore[return-value]  # as __iter__


class GraphTrace:
    """The default trace: the graph recorded during the forward, kept until dropped."""

    def __init__(self, module: Module, traced_input: Tensor | None, output: Tensor | None
                 ) -> None:
        self.module = module
        self.input = traced_input
        self.output = output
        # The trace keeps the parameter values it was made with, so that `update` may
        # write the parameters while it is alive (and a second backprop still agrees).
        own_saved_parameters(output, module.parameters())

    def backprop(self, grad_output: TensorLike) -> tuple[Tensor | None, GradTree]:
        params = list(self.module.named_parameters())
        targets = [p._node for _, p in params]
        if self.input is not None:
            targets.append(self.input._node)
        out = self.output
        results: dict[Any, Any] = {}
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


def flatten_tree(tree: GradTree, prefix: str = "") -> dict[str, Tensor]:
    """{"0": {"weight": g}} -> {"0.weight": g}."""
    flat: dict[str, Tensor] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten_tree(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def unflatten_tree(flat: Mapping[str, Tensor]) -> GradTree:
    """{"0.weight": g} -> {"0": {"weight": g}}: gradients shaped like the parameter tree."""
    tree: GradTree = {}
    for name, value in flat.items():
        node = tree
        *parents, leaf = name.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"unflatten_tree: {name!r} is below {part!r}, which is a "
                                 "value, not a subtree")
            node = child
        node[leaf] = value
    return tree
