"""`BackwardOps`: one backward kernel per op, each defaulting to forward ops on `self`.

Mix it in before a forward-only backend (`class B(BackwardOps, MyForwardBackend)`)
and the backend is trainable; a backend overrides a kernel only to fuse it.

Most defaults are not written here: the ops layer derives them from each primitive's
JVP rule, linearized and transposed (`derive_default`), so that the math is written
once as the rule and once more only in a backend's fused kernel, which the tests hold
to the rule. The binary defaults stay written in forward ops because they are
CpuBackend's own kernels (on the per-op hot path, where a transposed rule would cost
a linear graph per call); sum's and conv2d's bias defaults are broadcasts and sums,
no derivative to derive.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pullback.backend.base import Array, Backend, Mixin, Operand, Pair, Shape, check_gelu_mode
from pullback.errors import KernelError

# Which of a binary op's two cotangents are wanted; the two, None where not wanted.
Needed = tuple[bool, bool]
Grads = tuple[Array | None, Array | None]

# The default bodies that the ops layer derives from the primitives' rules, by kernel
# name (`derive_default`): this layer may not import the ops that hold the rules.
_FROM_RULES: dict[str, Callable[..., Any]] = {}


def derive_default(kernel: str, body: Callable[..., Any], owner: type | None = None) -> None:
    """Make `body(backend, upstream, input_shape, inputs, output, params)` the default
    of `BackwardOps.<kernel>` (or of `owner.<kernel>`, a backward kernel another mixin
    of this layer declares), one of the kernels whose default is derived from a rule."""
    owner = owner or BackwardOps
    if not callable(getattr(owner, kernel, None)):
        raise ValueError(f"{owner.__name__} has no kernel named {kernel!r}")
    _FROM_RULES[kernel] = body


def from_rule(backend: Backend, name: str, upstream: Array, inputs: tuple[Array | None, ...],
              output: Array | None, shapes: tuple[Shape, ...],
              needed: tuple[bool, ...] | None = None, **params: Any) -> tuple[Any, ...]:
    """The cotangents of the operands (of `shapes`) of the primitive whose kernel is
    `name`, by its rule transposed on `backend`'s forward ops (`derive_default`); None
    where one is not needed."""
    body = _FROM_RULES.get(name)
    if body is None:
        raise KernelError(name, [upstream], "no rule is registered to derive this "
                          "default from (pullback.ops registers them on import)")
    return body(backend, upstream, inputs, output, params, shapes, needed)


def _shape(value: Any) -> Shape:
    # Python scalars stand for 0-d operands.
    return tuple(getattr(value, "shape", ()))


def check_matmul_backward(upstream: Array, lhs: Array, rhs: Array) -> None:
    """A KernelError naming matmul_backward unless lhs @ rhs is defined and has
    upstream's shape (NumPy's rules, 1-D operands promoted)."""
    sa, sb, su = _shape(lhs), _shape(rhs), _shape(upstream)
    operands = [upstream, lhs, rhs]
    if not sa or not sb:
        raise KernelError("matmul_backward", operands,
                          "lhs and rhs must have at least one dimension")
    a2 = (1, *sa) if len(sa) == 1 else sa
    b2 = (*sb, 1) if len(sb) == 1 else sb
    if a2[-1] != b2[-2]:
        raise KernelError("matmul_backward", operands,
                          f"inner dimensions {a2[-1]} and {b2[-2]} of lhs and rhs differ")
    batch = a2[:-2] if a2[:-2] == b2[:-2] else _broadcast(a2[:-2], b2[:-2])
    if batch is None:
        raise KernelError("matmul_backward", operands, f"batch dimensions {a2[:-2]} and "
                          f"{b2[:-2]} of lhs and rhs cannot be broadcast together")
    expected = (*batch, *(a2[-2:-1] if len(sa) > 1 else ()), *(b2[-1:] if len(sb) > 1 else ()))
    if su != expected:
        raise KernelError("matmul_backward", operands,
                          f"upstream has shape {su} but lhs @ rhs has shape {expected}")


def _broadcast(sa: Shape, sb: Shape) -> Shape | None:
    n = max(len(sa), len(sb))
    sa, sb = (1,) * (n - len(sa)) + tuple(sa), (1,) * (n - len(sb)) + tuple(sb)
    if any(x != y and 1 not in (x, y) for x, y in zip(sa, sb)):
        return None
    return tuple(x if y == 1 else y for x, y in zip(sa, sb))


class BackwardOps(Mixin):
    """Backward kernels. `upstream` is the cotangent at the op's output; `forward_input`
    and `forward_output` are the saved forward values. Binary kernels return
    `(grad_lhs, grad_rhs)` reduced to each operand's shape, None where `needed` is False.
    A kernel taking `out=` writes its result there when given one, as `Backend`'s ops
    do; these defaults, computed with forward ops, return a new array instead."""

    # -- unary, row-wise and reductions ---------------------------------------------------

    def relu_backward(self, upstream: Array, forward_input: Array, out: Array | None = None
                      ) -> Array:
        """upstream where forward_input > 0, else 0."""
        # relu's rule reads its output, which is > 0 exactly where its input is.
        return self._one_from_rule("relu_backward", upstream, output=forward_input)

    def relu_bias_backward(self, upstream: Array, relu_output: Array, bias_shape: Shape,
                           out: Array | None = None) -> tuple[Array, Array]:
        """relu's backward (into `out` when given) and the gradient of the operand of
        `bias_shape` (a bias per channel, (1, C, 1, 1)) that was added to relu's input:
        that gradient summed to its shape. What a training plan runs for a relu after a
        convolution's bias, in one step."""
        grad = (self.relu_backward(upstream, relu_output) if out is None
                else self.relu_backward(upstream, relu_output, out=out))
        return grad, self.sum_to_shape(grad, bias_shape)

    def sigmoid_backward(self, upstream: Array, forward_output: Array) -> Array:
        """upstream * y * (1 - y)."""
        return self._one_from_rule("sigmoid_backward", upstream, output=forward_output)

    def tanh_backward(self, upstream: Array, forward_output: Array) -> Array:
        """upstream * (1 - y**2)."""
        return self._one_from_rule("tanh_backward", upstream, output=forward_output)

    def exp_backward(self, upstream: Array, forward_output: Array) -> Array:
        """upstream * e**x, reusing the output."""
        return self._one_from_rule("exp_backward", upstream, output=forward_output)

    def log_backward(self, upstream: Array, forward_input: Array) -> Array:
        """upstream / x."""
        return self._one_from_rule("log_backward", upstream, forward_input)

    def sqrt_backward(self, upstream: Array, forward_output: Array) -> Array:
        """upstream / (2 sqrt(x)), reusing the output."""
        return self._one_from_rule("sqrt_backward", upstream, output=forward_output)

    def abs_backward(self, upstream: Array, forward_input: Array) -> Array:
        """upstream * sign(x); zero at zero, as PyTorch."""
        return self._one_from_rule("abs_backward", upstream, forward_input)

    def silu_backward(self, upstream: Array, forward_input: Array) -> Array:
        """upstream * s * (1 + x (1 - s)) with s = sigmoid(x)."""
        return self._one_from_rule("silu_backward", upstream, forward_input)

    def softplus_backward(self, upstream: Array, forward_input: Array) -> Array:
        """upstream * sigmoid(x)."""
        return self._one_from_rule("softplus_backward", upstream, forward_input)

    def gelu_backward(
        self, upstream: Array, forward_input: Array, approximate: str = "none"
    ) -> Array:
        """upstream * d gelu / dx, exact or approximated, as `Backend.gelu`."""
        check_gelu_mode("gelu_backward", [upstream, forward_input], approximate)
        return self._one_from_rule("gelu_backward", upstream, forward_input,
                                   approximate=approximate)

    def softmax_backward(self, upstream: Array, forward_output: Array, axis: int) -> Array:
        """y * (upstream - sum(upstream * y, axis))."""
        return self._one_from_rule("softmax_backward", upstream, output=forward_output,
                                   axis=axis % forward_output.ndim)

    def log_softmax_backward(self, upstream: Array, forward_output: Array, axis: int) -> Array:
        """upstream - exp(y) * sum(upstream, axis), y being the log-softmax output."""
        return self._one_from_rule("log_softmax_backward", upstream, output=forward_output,
                                   axis=axis % forward_output.ndim)

    def _unreduce(self, upstream: Array, input_shape: Shape, axes: Shape, keepdims: bool) -> Array:
        if keepdims:
            return upstream
        kept = [1 if axis in axes else size for axis, size in enumerate(input_shape)]
        return self.reshape(upstream, tuple(kept))

    def reduce_sum_backward(
        self, upstream: Array, input_shape: Shape, axes: Shape, keepdims: bool
    ) -> Array:
        """upstream broadcast back over the summed axes, as a fresh array."""
        # The transpose of sum is a broadcast, which is no derivative to derive; written
        # here, it comes out as a fresh array rather than a read-only view of upstream.
        spread = self._unreduce(upstream, input_shape, axes, keepdims)
        return self.add(self.zeros(input_shape, upstream.dtype), spread)

    def reduce_max_backward(
        self,
        upstream: Array,
        forward_input: Array,
        forward_output: Array,
        axes: Shape,
        keepdims: bool,
    ) -> Array:
        """upstream to the maxima, split equally between ties (as torch.amax)."""
        return self._one_from_rule("reduce_max_backward", upstream, forward_input,
                                   forward_output, axes=tuple(axes), keepdims=keepdims)

    # -- binary ---------------------------------------------------------------------------

    def add_backward(
        self, upstream: Array, lhs_shape: Shape, rhs_shape: Shape, needed: Needed = (True, True)
    ) -> Grads:
        """upstream summed to each operand's shape."""
        return (
            self.sum_to_shape(upstream, lhs_shape) if needed[0] else None,
            self.sum_to_shape(upstream, rhs_shape) if needed[1] else None,
        )

    def sub_backward(
        self, upstream: Array, lhs_shape: Shape, rhs_shape: Shape, needed: Needed = (True, True)
    ) -> Grads:
        """(upstream, -upstream) summed to each operand's shape."""
        return (
            self.sum_to_shape(upstream, lhs_shape) if needed[0] else None,
            # Negating after the reduction touches fewer elements.
            self.neg(self.sum_to_shape(upstream, rhs_shape)) if needed[1] else None,
        )

    def mul_backward(
        self, upstream: Array, lhs: Operand, rhs: Operand, needed: Needed = (True, True)
    ) -> Grads:
        """(upstream * rhs, upstream * lhs) summed to each operand's shape."""
        return (
            self.sum_to_shape(self.mul(upstream, rhs), _shape(lhs)) if needed[0] else None,
            self.sum_to_shape(self.mul(upstream, lhs), _shape(rhs)) if needed[1] else None,
        )

    def div_backward(
        self, upstream: Array, lhs: Operand, rhs: Operand, needed: Needed = (True, True)
    ) -> Grads:
        """(upstream / rhs, -upstream * lhs / rhs**2) summed to each operand's shape."""
        quotient = self.div(upstream, rhs)
        grad_lhs = self.sum_to_shape(quotient, _shape(lhs)) if needed[0] else None
        grad_rhs = None
        if needed[1]:
            grad_rhs = self.sum_to_shape(self.neg(self.div(self.mul(quotient, lhs), rhs)),
                                         _shape(rhs))
        return grad_lhs, grad_rhs

    def maximum_backward(
        self, upstream: Array, lhs: Operand, rhs: Operand, needed: Needed = (True, True)
    ) -> Grads:
        """upstream to the larger operand, split equally on ties."""
        return self._pick_backward(upstream, lhs, rhs, needed, self.greater, self.less)

    def minimum_backward(
        self, upstream: Array, lhs: Operand, rhs: Operand, needed: Needed = (True, True)
    ) -> Grads:
        """upstream to the smaller operand, split equally on ties."""
        return self._pick_backward(upstream, lhs, rhs, needed, self.less, self.greater)

    def _pick_backward(
        self, upstream: Array, lhs: Operand, rhs: Operand, needed: Needed,
        lhs_wins: Callable[[Operand, Operand], Array],
        rhs_wins: Callable[[Operand, Operand], Array],
    ) -> Grads:
        # Ties split the gradient 0.5/0.5, as PyTorch's maximum and minimum do.
        tie = self.mul(self.astype(self.equal(lhs, rhs), upstream.dtype), 0.5)
        grads: list[Array | None] = []
        for wanted, wins, shape in ((needed[0], lhs_wins, _shape(lhs)),
                                    (needed[1], rhs_wins, _shape(rhs))):
            if not wanted:
                grads.append(None)
                continue
            weight = self.add(self.astype(wins(lhs, rhs), upstream.dtype), tie)
            grads.append(self.sum_to_shape(self.mul(upstream, weight), shape))
        return grads[0], grads[1]

    def matmul_backward(
        self, upstream: Array, lhs: Array, rhs: Array, needed: Needed = (True, True)
    ) -> Grads:
        """(upstream @ rhs^T, lhs^T @ upstream), batch dims summed back, 1-D operands
        handled as NumPy's matmul promotes them."""
        check_matmul_backward(upstream, lhs, rhs)
        return self._from_rule("matmul_backward", upstream, (lhs, rhs), None,
                               (_shape(lhs), _shape(rhs)), needed)

    def matmul_bias_backward(
        self, upstream: Array, lhs: Array, rhs: Array,
        needed: tuple[bool, bool, bool] = (True, True, True), out: Array | None = None,
    ) -> tuple[Array | None, Array | None, Array | None]:
        """matmul_backward and the gradient of a bias (upstream.shape[-1],) that was added
        to the product: upstream summed over its other axes. What a training plan runs
        for a dense layer's product and bias, in one step; None where not `needed`. With
        `out` (2-D operands), the lhs gradient upstream @ rhs^T is written there."""
        grad_lhs = grad_rhs = None
        if needed[0] and out is not None:
            grad_lhs = self.matmul(upstream, self.transpose(rhs, (1, 0)), out=out)
            needed = (False, needed[1], needed[2])
        if needed[0] or needed[1]:
            grads = self.matmul_backward(upstream, lhs, rhs, needed=(needed[0], needed[1]))
            grad_lhs = grads[0] if needed[0] else grad_lhs
            grad_rhs = grads[1]
        bias = self.sum_to_shape(upstream, _shape(upstream)[-1:]) if needed[2] else None
        return grad_lhs, grad_rhs, bias

    # -- convolution and pooling ----------------------------------------------------------

    def conv2d_input_backward(
        self, upstream: Array, weight: Array, input_shape: Shape, stride: Pair, padding: Pair,
        dilation: Pair = (1, 1), groups: int = 1, out: Array | None = None,
    ) -> Array:
        """Gradient wrt the conv input: weight^T @ upstream per group, folded back into
        windows."""
        return self._from_rule(
            "conv2d_input_backward", upstream, (None, weight), None,
            (tuple(input_shape), _shape(weight)), (True, False),
            stride=stride, padding=padding, dilation=dilation, groups=groups)[0]

    def conv2d_weight_backward(
        self, upstream: Array, forward_input: Array, weight_shape: Shape, stride: Pair,
        padding: Pair, dilation: Pair = (1, 1), groups: int = 1,
    ) -> Array:
        """Gradient wrt the conv weight: upstream @ windows^T per group, over batch and
        pixels."""
        return self._from_rule(
            "conv2d_weight_backward", upstream, (forward_input, None), None,
            (_shape(forward_input), tuple(weight_shape)), (False, True),
            stride=stride, padding=padding, dilation=dilation, groups=groups)[1]

    def conv2d_bias_backward(self, upstream: Array) -> Array:
        """upstream summed over batch and pixels."""
        return self.reduce_sum(upstream, (0, 2, 3), False)

    def max_pool2d_backward(
        self, upstream: Array, forward_input: Array, forward_output: Array, kernel: Pair,
        stride: Pair, padding: Pair, dilation: Pair = (1, 1), out: Array | None = None,
    ) -> Array:
        """upstream to the first maximum (row-major) of each window, as PyTorch."""
        return self._from_rule(
            "max_pool2d_backward", upstream, (forward_input,), forward_output,
            (_shape(forward_input),), kernel=tuple(kernel), stride=tuple(stride),
            padding=tuple(padding), dilation=tuple(dilation))[0]

    def avg_pool2d_backward(
        self, upstream: Array, input_shape: Shape, kernel: Pair, stride: Pair, padding: Pair,
        out: Array | None = None,
    ) -> Array:
        """upstream / (kh kw) spread over each window (count_include_pad=True)."""
        return self._from_rule(
            "avg_pool2d_backward", upstream, (None,), None, (tuple(input_shape),),
            kernel=tuple(kernel), stride=tuple(stride), padding=tuple(padding))[0]

    # -- derived from the rules ------------------------------------------------------------

    def _from_rule(self, name: str, upstream: Array, inputs: tuple[Array | None, ...],
                   output: Array | None, shapes: tuple[Shape, ...],
                   needed: Needed | None = None, **params: Any) -> tuple[Any, ...]:
        # The primitive's rule transposed, on this backend's forward ops (`derive_default`):
        # one cotangent per operand of the given shapes, None where it is not needed.
        return from_rule(self, name, upstream, inputs, output, shapes, needed, **params)

    def _one_from_rule(self, name: str, upstream: Array, forward_input: Array | None = None,
                       output: Array | None = None, **params: Any) -> Array:
        # Unary and row-wise ops keep their operand's shape.
        shape = _shape(forward_input if forward_input is not None else output)
        return self._from_rule(name, upstream, (forward_input,), output, (shape,),
                               **params)[0]
