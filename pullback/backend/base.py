"""`Backend`: the forward ops every backend runs, as one documented interface.

Each method here only raises `KernelError` naming the op; a concrete backend
(`CpuBackend`, a later GPU backend) overrides the ops it implements.
"""

from __future__ import annotations

from collections.abc import Callable
from types import EllipsisType
from typing import TYPE_CHECKING, Any, NoReturn

from numpy.typing import ArrayLike, DTypeLike, NDArray

from pullback.errors import KernelError

if TYPE_CHECKING:
    from pullback.kernels import ElementwiseKernel

# A backend-native array: a NumPy array (of any dtype) for the NumPy backends.
Array = NDArray[Any]
# An operand of a binary op or of `where`: an array, or a Python scalar standing for a
# 0-d one (NumPy's weak scalars: it takes the array's dtype).
Operand = NDArray[Any] | float
# What `getitem` takes, as NumPy's indexing: ints, slices, None, Ellipsis, int or bool
# arrays (or lists), or a tuple of them.
Index = int | slice | None | EllipsisType | NDArray[Any] | list[Any] | tuple[Any, ...]
Shape = tuple[int, ...]
Pair = tuple[int, int]

# gelu's modes, as PyTorch names them: exact (erf), or its tanh approximation.
GELU_MODES = ("none", "tanh")


def check_gelu_mode(op: str, operands: list[Any], approximate: object) -> None:
    """A KernelError naming `op` unless `approximate` is one of gelu's modes."""
    if approximate not in GELU_MODES:
        raise KernelError(op, operands, f"approximate must be 'none' or 'tanh', "
                          f"not {approximate!r}")


class Backend:
    """Forward ops on arrays. Arguments arrive normalized: `axes` is a sorted tuple of
    non-negative ints, `shape` a tuple of ints, stride/padding/kernel `(int, int)` pairs.
    Ops return new arrays and never mutate their inputs; invalid calls raise `KernelError`.

    An op taking `out=` writes its result there when given one (an array of the
    result's shape and dtype that a plan keeps across calls) and returns it; a plan
    passes one only to a backend whose `runs_plan_kernels()` is true."""

    name: str = "abstract"

    def _unimplemented(self, op: str) -> NoReturn:
        raise KernelError(op, [], f"backend {self.name} does not implement {op}")

    # -- what a plan may run in place of the ops ------------------------------------------

    def runs_plan_kernels(self) -> bool:
        """Whether a plan may run its own kernels in place of this backend's ops one by
        one: generated elementwise kernels over fused chains (`launch_elementwise`) and
        the `out=` forms of the ops, writing into buffers kept across calls. False here:
        a plan then calls the ops as eager code does. A backend answering True must
        compute with those kernels what its ops compute."""
        return False

    def launch_elementwise(self, kernel: ElementwiseKernel, operands: tuple[Operand, ...],
                           out: Array | None = None) -> Callable[..., Any]:
        """A call `launch(*operands, out=out)` of a generated elementwise kernel
        (`pullback.kernels.kernel`), prepared for operands of these shapes, dtypes and
        layouts (a plan's never change). Asked only where `runs_plan_kernels()`."""
        self._unimplemented("launch_elementwise")

    # -- unary ----------------------------------------------------------------------------

    def neg(self, x: Array) -> Array:
        """-x (ints too)."""
        self._unimplemented("neg")

    def exp(self, x: Array) -> Array:
        """e**x (floats only)."""
        self._unimplemented("exp")

    def log(self, x: Array) -> Array:
        """Natural log; log(0) is -inf (floats only)."""
        self._unimplemented("log")

    def sqrt(self, x: Array) -> Array:
        """Square root (floats only)."""
        self._unimplemented("sqrt")

    def abs(self, x: Array) -> Array:
        """|x| (ints too)."""
        self._unimplemented("abs")

    def sign(self, x: Array) -> Array:
        """-1, 0 or 1 by the sign of x (ints too)."""
        self._unimplemented("sign")

    def relu(self, x: Array) -> Array:
        """max(x, 0) (floats only)."""
        self._unimplemented("relu")

    def sigmoid(self, x: Array) -> Array:
        """1 / (1 + e**-x), without overflow for large |x| (floats only)."""
        self._unimplemented("sigmoid")

    def tanh(self, x: Array) -> Array:
        """Hyperbolic tangent (floats only)."""
        self._unimplemented("tanh")

    def silu(self, x: Array) -> Array:
        """x * sigmoid(x) (floats only)."""
        self._unimplemented("silu")

    def softplus(self, x: Array) -> Array:
        """log(1 + e**x), without overflow for large |x| (floats only)."""
        self._unimplemented("softplus")

    def erf(self, x: Array) -> Array:
        """The error function (floats only)."""
        self._unimplemented("erf")

    def gelu(self, x: Array, approximate: str = "none") -> Array:
        """x * Phi(x); `approximate="tanh"` uses PyTorch's tanh approximation (floats only)."""
        self._unimplemented("gelu")

    def sin(self, x: Array) -> Array:
        """Sine, x in radians; inf and NaN give NaN (floats only)."""
        self._unimplemented("sin")

    def cos(self, x: Array) -> Array:
        """Cosine, x in radians; inf and NaN give NaN (floats only)."""
        self._unimplemented("cos")

    # -- binary, NumPy broadcasting; either side may be a Python scalar -------------------

    def add(self, a: Operand, b: Operand) -> Array:
        """a + b."""
        self._unimplemented("add")

    def sub(self, a: Operand, b: Operand) -> Array:
        """a - b."""
        self._unimplemented("sub")

    def mul(self, a: Operand, b: Operand) -> Array:
        """a * b."""
        self._unimplemented("mul")

    def div(self, a: Operand, b: Operand) -> Array:
        """a / b (true division)."""
        self._unimplemented("div")

    def pow(self, a: Operand, b: Operand) -> Array:
        """a ** b."""
        self._unimplemented("pow")

    def maximum(self, a: Operand, b: Operand) -> Array:
        """Elementwise max; NaN propagates."""
        self._unimplemented("maximum")

    def minimum(self, a: Operand, b: Operand) -> Array:
        """Elementwise min; NaN propagates."""
        self._unimplemented("minimum")

    def less(self, a: Operand, b: Operand) -> Array:
        """a < b, a bool array."""
        self._unimplemented("less")

    def less_equal(self, a: Operand, b: Operand) -> Array:
        """a <= b, a bool array."""
        self._unimplemented("less_equal")

    def greater(self, a: Operand, b: Operand) -> Array:
        """a > b, a bool array."""
        self._unimplemented("greater")

    def greater_equal(self, a: Operand, b: Operand) -> Array:
        """a >= b, a bool array."""
        self._unimplemented("greater_equal")

    def equal(self, a: Operand, b: Operand) -> Array:
        """a == b, a bool array."""
        self._unimplemented("equal")

    def not_equal(self, a: Operand, b: Operand) -> Array:
        """a != b, a bool array."""
        self._unimplemented("not_equal")

    # -- selection and casting ------------------------------------------------------------

    def where(self, cond: Array, a: Operand, b: Operand) -> Array:
        """a where cond is true, else b, broadcast together."""
        self._unimplemented("where")

    def clip(self, x: Array, lo: float | None, hi: float | None) -> Array:
        """x limited to [lo, hi]; a None bound is no bound."""
        self._unimplemented("clip")

    def astype(self, x: Array, dtype: DTypeLike) -> Array:
        """A copy of x converted to dtype."""
        self._unimplemented("astype")

    # -- reductions -----------------------------------------------------------------------

    def reduce_sum(self, x: Array, axes: Shape, keepdims: bool) -> Array:
        """Sum over axes; axes=() copies."""
        self._unimplemented("reduce_sum")

    def reduce_max(self, x: Array, axes: Shape, keepdims: bool) -> Array:
        """Max over axes; axes=() copies; an empty reduced axis is an error."""
        self._unimplemented("reduce_max")

    def reduce_min(self, x: Array, axes: Shape, keepdims: bool) -> Array:
        """Min over axes; axes=() copies; an empty reduced axis is an error."""
        self._unimplemented("reduce_min")

    def reduce_prod(self, x: Array, axes: Shape, keepdims: bool) -> Array:
        """Product over axes; floats keep their dtype, ints and bools multiply as NumPy's
        prod does (as int64)."""
        self._unimplemented("reduce_prod")

    def argmax(self, x: Array, axis: int | None, keepdims: bool) -> Array:
        """int64 index of the first largest element along axis (None: of the flattened
        array); NaN counts as largest."""
        self._unimplemented("argmax")

    def argmin(self, x: Array, axis: int | None, keepdims: bool) -> Array:
        """int64 index of the first smallest element along axis (None: of the flattened
        array); NaN counts as smallest."""
        self._unimplemented("argmin")

    def argsort(self, x: Array, axis: int, descending: bool) -> Array:
        """int64 indices that sort x along axis, stably (equal elements keep their
        order, either way); NaN sorts as the largest value."""
        self._unimplemented("argsort")

    def cumsum(self, x: Array, axis: int, reverse: bool = False) -> Array:
        """Running sums along axis (from its last element back when `reverse`), shape
        unchanged; floats keep their dtype, ints and bools sum as NumPy's cumsum does."""
        self._unimplemented("cumsum")

    # -- shapes and indexing --------------------------------------------------------------

    def reshape(self, x: Array, shape: Shape) -> Array:
        """x with a new shape of the same size (may be a view)."""
        self._unimplemented("reshape")

    def transpose(self, x: Array, axes: Shape) -> Array:
        """x with its axes permuted by the full permutation `axes` (may be a view)."""
        self._unimplemented("transpose")

    def broadcast_to(self, x: Array, shape: Shape) -> Array:
        """x broadcast to shape (may be a read-only view)."""
        self._unimplemented("broadcast_to")

    def sum_to_shape(self, x: Array, shape: Shape) -> Array:
        """Sum a broadcast array back to `shape`: over leading extra dims and over dims
        where `shape` has 1. The one place that undoes broadcasting."""
        self._unimplemented("sum_to_shape")

    def getitem(self, x: Array, index: Index) -> Array:
        """x[index] for ints, slices, None, Ellipsis, int or bool arrays, or tuples of them."""
        self._unimplemented("getitem")

    def scatter_add(self, values: Array, index: Index, shape: Shape) -> Array:
        """zeros(shape) with values added at index, repeated indices accumulating: the
        adjoint of getitem."""
        self._unimplemented("scatter_add")

    def concatenate(self, arrays: list[Array] | tuple[Array, ...], axis: int) -> Array:
        """Join arrays along an existing axis."""
        self._unimplemented("concatenate")

    def pad2d(self, x: Array, padding: Pair, value: float = 0.0) -> Array:
        """Pad the last two axes by (ph, pw) on each side with value."""
        self._unimplemented("pad2d")

    # -- linear algebra and windows -------------------------------------------------------

    def matmul(self, a: Array, b: Array, out: Array | None = None) -> Array:
        """Matrix product with NumPy's rules: 1-D operands, broadcast batch dims."""
        self._unimplemented("matmul")

    def conv2d(
        self, x: Array, w: Array, stride: Pair, padding: Pair, dilation: Pair = (1, 1),
        groups: int = 1, out: Array | None = None,
    ) -> Array:
        """Cross-correlation of x (N, C, H, W) with w (O, C / groups, kh, kw), as PyTorch's
        conv2d without bias: kernel taps `dilation` apart, input and output channels in
        `groups` independent groups; returns (N, O, OH, OW)."""
        self._unimplemented("conv2d")

    def unfold2d(
        self, x: Array, kernel: Pair, stride: Pair, padding: Pair, pad_value: float = 0.0,
        dilation: Pair = (1, 1),
    ) -> Array:
        """The sliding windows of x (N, C, H, W) as (N, C, kh, kw, OH, OW) (im2col), taps
        `dilation` apart."""
        self._unimplemented("unfold2d")

    def fold2d(
        self, cols: Array, input_shape: Shape, kernel: Pair, stride: Pair, padding: Pair,
        dilation: Pair = (1, 1),
    ) -> Array:
        """The adjoint of unfold2d: sum windows (N, C, kh, kw, OH, OW) back into
        input_shape (N, C, H, W), overlaps added and padding cropped."""
        self._unimplemented("fold2d")

    def max_pool2d(
        self, x: Array, kernel: Pair, stride: Pair, padding: Pair, dilation: Pair = (1, 1),
        out: Array | None = None,
    ) -> Array:
        """Max over each window of x (N, C, H, W), taps `dilation` apart, padding
        counting as -inf."""
        self._unimplemented("max_pool2d")

    def avg_pool2d(self, x: Array, kernel: Pair, stride: Pair, padding: Pair,
                   out: Array | None = None) -> Array:
        """Mean over each window, padding counted as zeros (count_include_pad=True)."""
        self._unimplemented("avg_pool2d")

    def softmax(self, x: Array, axis: int) -> Array:
        """exp(x) / sum(exp(x)) along axis, with the max subtracted first."""
        self._unimplemented("softmax")

    def log_softmax(self, x: Array, axis: int) -> Array:
        """x - logsumexp(x) along axis, with the max subtracted first."""
        self._unimplemented("log_softmax")

    # -- creation and transfer ------------------------------------------------------------

    def asarray(self, data: ArrayLike, dtype: DTypeLike | None = None) -> Array:
        """A new backend array holding a copy of data (nested lists, scalars, arrays)."""
        self._unimplemented("asarray")

    def zeros(self, shape: Shape, dtype: DTypeLike) -> Array:
        """An array of zeros."""
        self._unimplemented("zeros")

    def ones(self, shape: Shape, dtype: DTypeLike) -> Array:
        """An array of ones."""
        self._unimplemented("ones")

    def full(self, shape: Shape, value: float, dtype: DTypeLike | None = None) -> Array:
        """An array filled with value."""
        self._unimplemented("full")

    def arange(self, start: float, stop: float | None = None, step: float = 1,
               dtype: DTypeLike | None = None) -> Array:
        """Evenly spaced values in [start, stop), as np.arange."""
        self._unimplemented("arange")

    def to_numpy(self, x: Array) -> NDArray[Any]:
        """x as a NumPy array (the array itself on the NumPy backends)."""
        self._unimplemented("to_numpy")


# The base of this layer's mixins (`BackwardOps`, `FusedOps`, ...), whose defaults call
# the forward ops of the backend they are mixed into: `Backend` for type checkers, so
# that those calls are checked; nothing at run time (`object`), so that a mixin adds no
# base class to the backends that use it.
if TYPE_CHECKING:
    Mixin = Backend
else:
    Mixin = object
