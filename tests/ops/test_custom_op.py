"""pb.CustomOp: users' NumPy ops with backward and jvp; inference-only ops refuse to
be differentiated, naming the op."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback.ad import DerivativeError


class Cube(pb.CustomOp):
    def forward(self, x):
        return x ** 3

    def backward(self, upstream, inputs, output):
        (x,) = inputs
        return (upstream * 3 * x ** 2,)

    def jvp(self, tangents, inputs, output):
        (t,), (x,) = tangents, inputs
        return t * 3 * x ** 2


class MaskedScale(pb.CustomOp):
    """x * scale where mask: a second, non-differentiable input."""

    def forward(self, x, mask):
        return np.where(mask, x * 2.0, x)

    def backward(self, upstream, inputs, output):
        _, mask = inputs
        return (np.where(mask, upstream * 2.0, upstream), None)


class Opaque(pb.CustomOp):
    def forward(self, x):
        return np.sort(x)


def test_custom_op_forward_and_backward_match_torch() -> None:
    x0 = np.random.default_rng(0).standard_normal(5)
    x = pb.tensor(x0, requires_grad=True)
    Cube()(x).sum().backward()
    t = torch.tensor(x0, requires_grad=True)
    (t ** 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_gradcheck_works_on_custom_ops(mode: str) -> None:
    x = pb.randn(4, dtype=np.float64, seed=1)
    assert pb.gradcheck(lambda x: Cube()(pb.tanh(x)) * 2.0, (x,), mode=mode)


def test_custom_op_jvp_gives_forward_mode() -> None:
    x, t = pb.randn(4, dtype=np.float64, seed=1), pb.randn(4, dtype=np.float64, seed=2)
    _, tangent = pb.jvp(Cube(), (x,), (t,))
    np.testing.assert_allclose(tangent.numpy(), t.numpy() * 3 * x.numpy() ** 2)


def test_a_none_gradient_leaves_a_non_differentiable_input_alone() -> None:
    x = pb.tensor([1.0, 2.0, 3.0], requires_grad=True)
    MaskedScale()(x, np.array([True, False, True])).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 1.0, 2.0])


def test_an_inference_only_op_runs_but_refuses_backward_naming_op_and_parameter() -> None:
    w = pb.tensor([3.0, 1.0, 2.0], requires_grad=True)
    with pb.no_grad():
        np.testing.assert_array_equal(Opaque()(w).numpy(), [1.0, 2.0, 3.0])
    loss = Opaque()(w * 2.0).sum()
    with pytest.raises(DerivativeError, match=r"Opaque.*shape \(3,\)"):
        loss.backward()
    with pytest.raises(DerivativeError, match="Opaque"):
        pb.grad(lambda w: Opaque()(w).sum())(w)


def test_forward_mode_without_jvp_is_an_error_naming_the_op() -> None:
    with pytest.raises(DerivativeError, match="MaskedScale defines no jvp"):
        pb.jvp(lambda x: MaskedScale()(x, np.array([True])), (pb.ones(1),), (pb.ones(1),))


def test_second_derivatives_through_numpy_backward_are_refused() -> None:
    with pytest.raises(DerivativeError, match="second derivatives through Cube"):
        pb.grad(lambda x: pb.grad(lambda y: Cube()(y).sum())(x).sum())(pb.ones(2))


class WrongShape(pb.CustomOp):
    def forward(self, x):
        return x * 2.0

    def backward(self, upstream, inputs, output):
        return (upstream[:1],)


class NotAnArray(pb.CustomOp):
    def forward(self, x):
        return float(x.sum())


def test_bad_custom_op_results_are_errors_naming_the_op() -> None:
    x = pb.ones(3, requires_grad=True)
    with pytest.raises(pb.KernelError, match=r"WrongShape.*backward \(input 0\) returned "
                       r"shape \(1,\)"):
        WrongShape()(x).sum().backward()
    with pytest.raises(pb.KernelError, match=r"NotAnArray: .*forward returned a float"):
        NotAnArray()(x)


def test_gradcheck_works_on_a_custom_op_without_jvp_by_checking_reverse_mode() -> None:
    x = pb.randn(3, dtype=np.float64, seed=4)
    mask = np.array([True, False, True])
    for mode in ("fast", "full"):
        assert pb.gradcheck(lambda x: MaskedScale()(x, mask), (x,), mode=mode)


def test_gradcheck_still_catches_a_wrong_backward_without_jvp() -> None:
    class WrongCube(pb.CustomOp):
        def forward(self, x):
            return x ** 3

        def backward(self, upstream, inputs, output):
            return (upstream * 2 * inputs[0] ** 2,)  # should be 3 x^2

    with pytest.raises(pb.GradcheckError):
        pb.gradcheck(lambda x: WrongCube()(x), (pb.randn(3, dtype=np.float64, seed=1),))


def test_custom_op_backward_sees_integer_inputs_unchanged() -> None:
    seen = []

    class Pick(pb.CustomOp):
        def forward(self, x, index):
            return x[np.arange(len(index)), index]

        def backward(self, upstream, inputs, output):
            x, index = inputs
            seen.append(index.dtype)
            grad = np.zeros_like(x)
            grad[np.arange(len(index)), index] = upstream
            return grad, None

    x = pb.randn(3, 4, seed=0, requires_grad=True)
    Pick()(x, np.array([0, 3, 1])).sum().backward()
    assert seen == [np.dtype(np.int64)]
    np.testing.assert_array_equal(x.grad.numpy().sum(axis=1), [1.0, 1.0, 1.0])


class GainWithoutItsGradient(pb.CustomOp):
    """x * gain whose backward forgets the gain: None for an input that needs one."""

    def forward(self, x, gain):
        return x * gain

    def backward(self, upstream, inputs, output):
        _, gain = inputs
        return (upstream * gain, None)


class _Gained(pb.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = pb.nn.Dense(3, 2)
        self.gain = pb.nn.Parameter(pb.ones(2))

    def forward(self, x):
        return GainWithoutItsGradient()(self.lin(x), self.gain)


@pytest.mark.parametrize("fused", [True, False])
def test_a_none_gradient_for_a_parameters_input_is_an_error_naming_op_input_and_parameter(
        fused: bool) -> None:
    from pullback.tensor.backward import fused_kernels

    model = _Gained()
    with fused_kernels(fused), pytest.raises(
            DerivativeError, match=r"GainWithoutItsGradient\.backward returned None for input 1 "
                                   r"\(\(2,\) float32\).*" + (r"parameter gain \(2,\)" if fused
                                                              else "parameter")):
        model(pb.ones(4, 3)).sum().backward()
    assert model.gain.grad is None
    # Through pb.grad, and through the module's explicit backprop.
    with pytest.raises(DerivativeError, match=r"GainWithoutItsGradient\.backward returned None"):
        pb.grad(lambda g: GainWithoutItsGradient()(pb.ones(2), g).sum())(pb.ones(2))
    _, trace = model.traced_forward(pb.ones(4, 3))
    with pytest.raises(DerivativeError, match=r"returned None for input 1.*parameter gain"):
        model.backprop(trace, pb.ones(4, 2))


def test_a_none_gradient_off_the_parameters_path_is_fine() -> None:
    gain = pb.tensor([2.0, 3.0])  # needs no gradient
    x = pb.tensor([1.0, 1.0], requires_grad=True)
    GainWithoutItsGradient()(x, gain).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 3.0])
    np.testing.assert_array_equal(
        pb.grad(lambda x: GainWithoutItsGradient()(x, gain).sum())(pb.ones(2)).numpy(),
        [2.0, 3.0])


def test_a_training_plan_refuses_a_none_gradient_for_a_parameters_input() -> None:
    from pullback.lower.graph import LoweringError

    model = _Gained()
    x = pb.ones(4, 3)
    step = pb.compile(lambda x: model(x).sum(), x, mode=pb.LoweringMode.TRAINING)
    # Its backward runs at the plan's first call: the error is a DerivativeError there.
    with pytest.raises(DerivativeError, match=r"plan: GainWithoutItsGradient\.backward returned "
                                            r"None for input 1"):
        step(x)
    assert model.gain.grad is None
    with pytest.raises(LoweringError):  # and, as every plan error, a LoweringError
        step(x)


class SigmoidFromOutput(pb.CustomOp):
    """Its backward reads only the output, so only the output is saved."""

    saves = ("output",)

    def forward(self, x):
        return 1.0 / (1.0 + np.exp(-x))

    def backward(self, upstream, inputs, output):
        assert inputs == (None,)
        return (upstream * output * (1.0 - output),)

    def jvp(self, tangents, inputs, output):
        return tangents[0] * output * (1.0 - output)


class ScaleByConstant(pb.CustomOp):
    """Linear: its backward reads nothing saved."""

    saves = ()

    def forward(self, x):
        return x * 3.0

    def backward(self, upstream, inputs, output):
        assert inputs == (None,) and output is None
        return (upstream * 3.0,)


def test_a_custom_op_saves_only_what_its_backward_reads() -> None:
    import weakref

    x0 = np.random.default_rng(0).standard_normal(4)
    x = pb.tensor(x0, requires_grad=True)
    h = x * 2.0  # a recorded input: without `saves`, the op's node would keep it alive
    watch = weakref.ref(h._data)
    y = SigmoidFromOutput()(h)
    del h
    assert watch() is None  # not kept by the pending backward
    t = torch.tensor(x0, requires_grad=True)
    torch.sigmoid(t * 2.0).sum().backward()
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12)
    # An unsaved input may be written after forward: the read-only guard has no reason
    # to object, while a saved output is still guarded.
    w = pb.tensor(x0, requires_grad=True)
    z = ScaleByConstant()(w) + SigmoidFromOutput()(w)
    with pb.no_grad():
        w.add_(1.0)
    z.sum().backward()
    s = 1.0 / (1.0 + np.exp(-x0))
    np.testing.assert_allclose(w.grad.numpy(), 3.0 + s * (1.0 - s), rtol=1e-12)
    v = pb.tensor(x0, requires_grad=True)
    out = SigmoidFromOutput()(v)
    with pytest.raises(RuntimeError, match="pending backward of SigmoidFromOutput"), \
            pb.no_grad():
        out.add_(1.0)


@pytest.mark.parametrize("fused", [True, False])
def test_unsaved_values_reach_every_derivative_path(fused: bool) -> None:
    from pullback.tensor.backward import fused_kernels

    x = pb.randn(5, dtype=np.float64, seed=3)
    with fused_kernels(fused):
        assert pb.gradcheck(lambda x: ScaleByConstant()(SigmoidFromOutput()(x)), (x,))
    _, tangent = pb.jvp(SigmoidFromOutput(), (x,), (pb.ones(5, dtype=np.float64),))
    s = 1.0 / (1.0 + np.exp(-x.numpy()))
    np.testing.assert_allclose(tangent.numpy(), s * (1.0 - s), rtol=1e-12)


def test_a_training_plan_runs_an_op_that_saves_nothing() -> None:
    w = pb.nn.Parameter(pb.ones(3, dtype=np.float64))
    x = pb.randn(3, dtype=np.float64, seed=0)
    step = pb.compile(lambda x: (SigmoidFromOutput()(ScaleByConstant()(x * w))).sum(), x,
                      mode=pb.LoweringMode.TRAINING)
    step(x)
    s = 1.0 / (1.0 + np.exp(-3.0 * x.numpy()))
    np.testing.assert_allclose(w.grad.numpy(), s * (1.0 - s) * 3.0 * x.numpy(), rtol=1e-12)


def test_saves_must_name_inputs_or_output() -> None:
    class Bad(pb.CustomOp):
        saves = ("input",)

        def forward(self, x):
            return x

    with pytest.raises(TypeError, match=r"Bad\.saves must be a tuple"):
        Bad()(pb.ones(2))
