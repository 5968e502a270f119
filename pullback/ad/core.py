"""Primitives, their rule registries, symbolic zeros and linear variables.

The vocabulary of the autodiff core. A `Primitive` carries its rules side by
side (JVP rules for non-linear primitives, a transpose rule for linear ones,
an optional fused VJP); `bind` applies it to operands. The core never computes
on operands itself: concrete operands go to the evaluator that the layer above
installs (`set_default_evaluator`; per thread, `set_evaluator`), and `LinearVar`
operands are recorded into the linear graph they belong to. Nothing here imports
NumPy.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .linear import LinearGraph


class Zero:
    """A symbolic zero tangent or cotangent: stands for zeros that are never built."""

    __slots__ = ("dtype", "shape")

    def __init__(self, shape: Any, dtype: Any):
        self.shape = shape
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"Zero({self.shape}, {self.dtype})"


class LinearVar:
    """A symbolic tangent or cotangent inside a linear graph being traced.

    Applying a primitive to a `LinearVar` records an equation instead of
    computing; the primitive must be linear in that operand.
    """

    __slots__ = ("dtype", "graph", "shape")
    # NumPy must defer to our operators instead of building object arrays.
    __array_ufunc__ = None

    # graph None: a placeholder that stands for an active operand in a transpose rule
    # called directly (`transpose_node`), which reads its shape and dtype only.
    def __init__(self, graph: LinearGraph | None, shape: Any, dtype: Any):
        self.graph = graph
        self.shape = shape
        self.dtype = dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"LinearVar({self.shape}, {self.dtype})"


class DerivativeError(TypeError):
    """A primitive lacks the derivative rule that a transform asked for."""


class ForwardModeError(DerivativeError):
    """An op can be differentiated in reverse mode only (a custom op without jvp)."""


Rule = Callable[..., Any]


def _no_forward(name: str) -> Rule:
    def impl(*args: Any, **params: Any) -> Any:
        raise TypeError(f"{name}: the primitive declares no forward (impl)")
    return impl


class Primitive:
    """An operation the autodiff core knows by its rules.

    - `jvp`: per-argument JVP rules `rule(tangent, output, *inputs, **params)`,
      `None` for an argument with no derivative (an index, a mask);
    - `jvp_full`: one rule `rule(tangents, output, inputs, **params)` that sees
      every tangent, `Zero` included (for jointly linear ops such as add);
    - `transpose`: `rule(ct, *args, **params)` for a primitive linear in the
      positions `linear_args` (in one at a time when `bilinear`); linear
      operands arrive as `LinearVar`s, constants as values; returns one
      cotangent (or None) per argument;
    - `vjp`: an optional fused backward, `rule(backend, upstream, node)`,
      returning one array (or None) per input;
    - `abstract_eval`: the shape rule, `rule(*args, **params) -> (shape, dtype)`;
    - `saves_inputs` / `saves_output`: what the rules read of the forward pass,
      so that a recorded node keeps exactly that and nothing else;
    - `saving_impl`: the forward to run where a backward through this application will
      follow (an eager op recorded for one, an active step of a training plan): the same
      result, which may carry in its memory what the `vjp` would otherwise compute again
      (attention's probabilities); None: `impl` serves both. An inference run never
      pays for what only a backward reads;
    - `saving_bytes`: `rule(*args, **params)` on the operands' shapes and dtypes (a
      plan's variables): about how many bytes `saving_impl` keeps beyond its result,
      for a plan's memory estimates; None: nothing.

    The other layers' facts about the primitive live here too, registered beside its
    declaration (the ops layer) or against this object (a layer above, such as ONNX
    export). The core never reads them; each says what its absence means:

    - `fusion`: how a plan fuses it into a generated elementwise kernel (scalar code);
      None: never fused;
    - `aliasing`: "fresh" (its result never shares memory with an operand), "view" (a
      view of its first operand, as reshape and transpose give of a parameter) or
      "may" (the safe default: it may or may not);
    - `into`: `rule(backend, *args, out, **params)` writing its result into a given
      buffer (a plan's, kept across calls); None: its result is a new array each call;
    - `layout`: `rule(*args)` giving the memory order ("C" or "F") its result comes in
      on the backends that run plan kernels; None: "C";
    - `ct_into`: how its first operand's cotangent is written into a given buffer;
      None: a new array each call;
    - `absorbs`: a primitive whose backward this one's can take in when that one feeds
      it alone (max_pool2d absorbs relu's); None: none;
    - `then_relu`: `rule(backend, *args, out=None, **params)` giving relu of its result,
      in one pass where it can (into `out`, a plan's buffer, on a backend that runs plan
      kernels): a plan runs it for this op and a relu that alone reads its result
      (batch_norm); None: the two stay apart;
    - `masks_keep_shape`: True when a boolean mask among its parameters leaves its
      result's shape independent of the mask's values (where's condition); False: such
      a mask, computed from a plan's inputs, is refused (a getitem by mask);
    - `method`: the function that `Tensor.<its __name__>` is; None: no method;
    - `exporter`: what ONNX export registered for it; None: it does not export;
    - `check`: how `pullback check` samples and applies it (an ops.checks.Spec); None:
      no check declared, which `pullback check` reports as a failure.
    """

    __slots__ = (
        "absorbs",
        "abstract_eval",
        "aliasing",
        "bilinear",
        "check",
        "ct_into",
        "differentiable",
        "exact_inputs",
        "exporter",
        "fusion",
        "impl",
        "into",
        "jvp",
        "jvp_full",
        "layout",
        "linear_args",
        "masks_keep_shape",
        "method",
        "name",
        "saves_inputs",
        "saves_output",
        "saving_bytes",
        "saving_impl",
        "then_relu",
        "transpose",
        "vjp",
    )

    def __init__(
        self,
        name: str,
        *,
        saves_inputs: bool = False,
        saves_output: bool = False,
        differentiable: bool = True,
    ):
        self.name = name
        self.saves_inputs = saves_inputs
        self.saves_output = saves_output
        self.differentiable = differentiable
        # Saved integer operands are kept as floats of the result's dtype for fused kernels
        # (g * other); a primitive whose rules must see them unchanged says so here.
        self.exact_inputs = False
        # The forward, `impl(backend, *operands, **params)`; until one is declared, a call
        # says which primitive lacks it.
        self.impl: Rule = _no_forward(name)
        self.saving_impl: Rule | None = None
        self.saving_bytes: Rule | None = None
        self.abstract_eval: Rule | None = None
        self.jvp: tuple[Rule | None, ...] | None = None
        self.jvp_full: Rule | None = None
        self.transpose: Rule | None = None
        self.linear_args: frozenset[int] = frozenset()
        self.bilinear = False
        self.vjp: Rule | None = None
        self.fusion: Any = None
        self.aliasing = "may"
        self.into: Rule | None = None
        self.layout: Rule | None = None
        self.ct_into: Any = None
        self.absorbs: Primitive | None = None
        self.then_relu: Rule | None = None
        self.masks_keep_shape = False
        self.method: Rule | None = None
        self.exporter: Any = None
        self.check: Any = None

    def __repr__(self) -> str:
        return f"Primitive({self.name})"

    @property
    def has_derivative(self) -> bool:
        return self.jvp is not None or self.jvp_full is not None

    def bind(self, *args: Any, **params: Any) -> Any:
        """Apply the primitive: record it if an operand is a `LinearVar`, else evaluate."""
        for arg in args:
            if type(arg) is LinearVar:
                assert arg.graph is not None, f"{self.name}: a placeholder tangent in an op"
                return arg.graph.record(self, args, params)
        return EVALUATOR.get(_default_evaluator)(self, args, params)

    def bind1(self, x: Any) -> Any:
        """`bind` for one operand and no parameters: the hot path of unary ops."""
        if type(x) is LinearVar:
            assert x.graph is not None, f"{self.name}: a placeholder tangent in an op"
            return x.graph.record(self, (x,), _NO_PARAMS)
        return EVALUATOR.get(_default_evaluator)(self, (x,), _NO_PARAMS)


_NO_PARAMS: dict = {}  # shared by parameterless applications; nothing writes into it


def _no_evaluator(prim: Primitive, args: tuple, params: dict) -> Any:
    raise RuntimeError(f"{prim.name}: no evaluator is installed for concrete operands")


# The evaluator of every thread that has not installed its own (`set_default_evaluator`).
_default_evaluator: Callable[[Primitive, tuple, dict], Any] = _no_evaluator
# This thread's own evaluator (a tracer that `pb.compile` installs), unset otherwise: one
# thread's tracer must not capture another thread's ops. A ContextVar, as each thread has
# its own context and `get` is one C call on the per-op hot path.
EVALUATOR: ContextVar[Callable[[Primitive, tuple, dict], Any]] = ContextVar(
    "pullback_evaluator")


def set_default_evaluator(evaluator: Callable[[Primitive, tuple, dict], Any]) -> None:
    """Install the evaluator of every thread that has not installed its own (the eager
    one, at import)."""
    global _default_evaluator
    _default_evaluator = evaluator


def set_evaluator(evaluator: Callable[[Primitive, tuple, dict], Any]) -> Callable:
    """Install how concrete operands are computed on in this thread; returns the
    previous evaluator, to be installed again when done."""
    previous = EVALUATOR.get(_default_evaluator)
    EVALUATOR.set(evaluator)
    return previous


def current_evaluator() -> Callable[[Primitive, tuple, dict], Any]:
    """The evaluator this thread computes with now."""
    return EVALUATOR.get(_default_evaluator)


# The primitive that sums two tangents; the layer that declares primitives names it.
_tangent_add: list[Primitive] = []


def set_tangent_add(prim: Primitive) -> None:
    """Name the primitive that adds two tangents (per-argument JVP contributions)."""
    _tangent_add[:] = [prim]


def add_tangents(a: Any, b: Any) -> Any:
    """The sum of two tangents (recorded when either is a `LinearVar`)."""
    return _tangent_add[0].bind(a, b)


def defjvp(prim: Primitive, *rules: Rule | None) -> None:
    """Declare one JVP rule per argument (None: that argument has no derivative)."""
    prim.jvp = rules


def defjvp_full(prim: Primitive, rule: Rule) -> None:
    """Declare a JVP rule that receives every tangent, symbolic zeros included."""
    prim.jvp_full = rule


class _AllArgs(frozenset):
    """Stands for every argument position: a primitive linear in all its operands."""

    def issuperset(self, other: object) -> bool:  # type: ignore[override]
        return True

    def __contains__(self, item: object) -> bool:
        return True


#: `linear_args` of a primitive jointly linear in any number of operands (concatenate).
ALL_ARGS = _AllArgs()


def deflinear(
    prim: Primitive, transpose: Rule, linear_args: tuple[int, ...] | frozenset = (0,)
) -> None:
    """Declare a primitive linear in `linear_args` (jointly): JVP is the primitive itself."""
    prim.transpose = transpose
    prim.linear_args = linear_args if linear_args is ALL_ARGS else frozenset(linear_args)
    if prim.jvp is None and prim.jvp_full is None:
        if linear_args != (0,):
            raise ValueError(f"{prim.name}: jointly linear in {linear_args}; declare jvp_full")

        def jvp(t: Any, output: Any, *inputs: Any, **params: Any) -> Any:
            return prim.bind(t, *inputs[1:], **params)

        prim.jvp = (jvp,)


def defbilinear(prim: Primitive, transpose_lhs: Rule, transpose_rhs: Rule) -> None:
    """Declare a primitive linear in each of its two operands separately (mul, matmul).

    The JVP follows: d(x*y) = dx*y + x*dy. Each transpose rule receives the
    cotangent and both operands, the linear one as a `LinearVar`.
    """
    prim.saves_inputs = True
    prim.linear_args = frozenset((0, 1))
    prim.bilinear = True

    def transpose(ct: Any, lhs: Any, rhs: Any, **params: Any) -> tuple:
        if type(lhs) is LinearVar:
            return transpose_lhs(ct, lhs, rhs, **params), None
        return None, transpose_rhs(ct, lhs, rhs, **params)

    prim.transpose = transpose
    prim.jvp = (
        lambda t, output, lhs, rhs, **params: prim.bind(t, rhs, **params),
        lambda t, output, lhs, rhs, **params: prim.bind(lhs, t, **params),
    )


def defvjp(prim: Primitive, rule: Rule) -> None:
    """Declare a fused backward `rule(backend, upstream, node)` for eager execution."""
    prim.vjp = rule


def jvp_of(prim: Primitive, tangents: tuple, output: Any, inputs: tuple, params: dict) -> Any:
    """The tangent of a primitive's output given its inputs' tangents (`Zero` if inactive).

    Returns None when every tangent is zero.
    """
    if prim.jvp_full is not None:
        return prim.jvp_full(tangents, output, inputs, **params)
    rules = prim.jvp
    if rules is None:
        raise DerivativeError(f"{prim.name} has no derivative rule")
    result = None
    for index, tangent in enumerate(tangents):
        if tangent is None or type(tangent) is Zero:
            continue
        rule = rules[index] if index < len(rules) else None
        if rule is None:
            raise DerivativeError(f"{prim.name} is not differentiable in argument {index}")
        contribution = rule(tangent, output, *inputs, **params)
        result = contribution if result is None else add_tangents(result, contribution)
    return result
