"""The losses against torch.nn.functional in float32 and float64: values and gradients
for every reduction, ignore_index, label smoothing, probability targets and the
(N, C, d1, d2) layout; a plan that meets ignored labels only after it was traced; and
bad operands refused with errors naming the loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pullback as pb
from pullback import nn

rng = np.random.default_rng(21)
LOGITS = rng.standard_normal((4, 5)) * 3
LABELS = np.array([0, 3, -100, 4])  # one ignored (the default ignore_index)
LOGITS_4D = rng.standard_normal((2, 5, 3, 2)) * 3
LABELS_4D = rng.integers(0, 5, (2, 3, 2))
LABELS_4D[0, 1] = 2  # ignored below, with ignore_index=2
PROBS_4D = rng.dirichlet(np.ones(5), (2, 3, 2)).transpose(0, 3, 1, 2)
LOG_PROBS = np.log(rng.dirichlet(np.ones(5), 4))
X, Y = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
Y_NEAR = X + rng.choice([-0.3, 0.3, -1.5, 1.5], X.shape)  # both sides of beta, delta
PROBABILITIES = rng.uniform(0.1, 0.9, (3, 4))
WEIGHT, POS_WEIGHT = rng.uniform(0.5, 2.0, (3, 4)), rng.uniform(0.5, 3.0, (4,))

# (name, pullback loss, torch loss, float inputs (differentiated), integer labels or None)
CASES = [
    ("cross_entropy_ignore_index", nn.cross_entropy, F.cross_entropy, [LOGITS], LABELS),
    ("cross_entropy_label_smoothing",
     lambda x, y, reduction: nn.cross_entropy(x, y, label_smoothing=0.2, reduction=reduction),
     lambda x, y, reduction: F.cross_entropy(x, y, label_smoothing=0.2, reduction=reduction),
     [LOGITS], LABELS),
    ("cross_entropy_4d_ignore_index_smoothing",
     lambda x, y, reduction: nn.cross_entropy(x, y, ignore_index=2, label_smoothing=0.1,
                                              reduction=reduction),
     lambda x, y, reduction: F.cross_entropy(x, y, ignore_index=2, label_smoothing=0.1,
                                             reduction=reduction),
     [LOGITS_4D], LABELS_4D),
    ("cross_entropy_4d_probabilities",
     lambda x, p, reduction: nn.cross_entropy(x, p, label_smoothing=0.3, reduction=reduction),
     lambda x, p, reduction: F.cross_entropy(x, p, label_smoothing=0.3, reduction=reduction),
     [LOGITS_4D, PROBS_4D], None),
    ("cross_entropy_unbatched", nn.cross_entropy, F.cross_entropy, [LOGITS[0]], np.array(3)),
    ("nll_loss", nn.nll_loss, F.nll_loss, [LOG_PROBS], LABELS),
    ("nll_loss_4d_ignore_index",
     lambda x, y, reduction: nn.nll_loss(x, y, ignore_index=2, reduction=reduction),
     lambda x, y, reduction: F.nll_loss(x, y, ignore_index=2, reduction=reduction),
     [LOGITS_4D], LABELS_4D),
    ("binary_cross_entropy_with_logits", nn.binary_cross_entropy_with_logits,
     F.binary_cross_entropy_with_logits, [X * 40, PROBABILITIES], None),
    ("binary_cross_entropy_with_logits_weights",
     lambda x, y, w, reduction: nn.binary_cross_entropy_with_logits(
         x, y, weight=w, reduction=reduction, pos_weight=POS_WEIGHT.astype(x.dtype)),
     lambda x, y, w, reduction: F.binary_cross_entropy_with_logits(
         x, y, weight=w.detach(), reduction=reduction, pos_weight=torch.from_numpy(POS_WEIGHT)),
     [X * 40, PROBABILITIES, WEIGHT], None),
    ("mse_loss", nn.mse_loss, F.mse_loss, [X, Y], None),
    ("l1_loss", nn.l1_loss, F.l1_loss, [X, Y], None),
    ("smooth_l1_loss",
     lambda x, y, reduction: nn.smooth_l1_loss(x, y, reduction, beta=0.5),
     lambda x, y, reduction: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.5),
     [X, Y_NEAR], None),
    ("smooth_l1_loss_beta_0",
     lambda x, y, reduction: nn.smooth_l1_loss(x, y, reduction, beta=0.0),
     lambda x, y, reduction: F.smooth_l1_loss(x, y, reduction=reduction, beta=0.0),
     [X, Y_NEAR], None),
    ("huber_loss",
     lambda x, y, reduction: nn.huber_loss(x, y, reduction, delta=0.7),
     lambda x, y, reduction: F.huber_loss(x, y, reduction=reduction, delta=0.7),
     [X, Y_NEAR], None),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name, loss, reference, floats, labels", CASES,
                         ids=[c[0] for c in CASES])
def test_loss_and_gradients_match_torch_for_every_reduction(name, loss, reference, floats,
                                                             labels, dtype) -> None:
    tol = 1e-5 if dtype == np.float32 else 1e-12
    arrays = [a.astype(dtype) for a in floats]
    # The last float input of weighted BCE is the weight: torch differentiates none of it.
    active = len(arrays) - (1 if name.endswith("_weights") else 0)
    for reduction in ("mean", "sum", "none"):
        xs = [pb.tensor(a, requires_grad=i < active) for i, a in enumerate(arrays)]
        ts = [torch.tensor(a.astype(np.float64), requires_grad=i < active)
              for i, a in enumerate(arrays)]
        extra = () if labels is None else (labels,)
        got = loss(*xs, *extra, reduction=reduction)
        want = reference(*ts, *(torch.from_numpy(v) for v in extra), reduction=reduction)
        assert got.dtype == dtype and got.shape == tuple(want.shape), (name, reduction)
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=tol, atol=tol,
                                   err_msg=f"{name} {reduction}")
        g = rng.standard_normal(got.shape)
        (got * pb.tensor(g.astype(dtype))).sum().backward()
        (want * torch.from_numpy(g)).sum().backward()
        for i in range(active):
            np.testing.assert_allclose(xs[i].grad.numpy(), ts[i].grad.numpy(), rtol=tol,
                                       atol=tol, err_msg=f"{name} {reduction}: input {i}")


def test_cross_entropy_second_derivative_with_ignored_labels_matches_torch() -> None:
    def f(x):
        return nn.cross_entropy(x, LABELS, label_smoothing=0.1)

    v = rng.standard_normal(LOGITS.shape)
    got = pb.grad(lambda x: (pb.grad(f)(x) * pb.tensor(v)).sum())(pb.tensor(LOGITS))
    t = torch.tensor(LOGITS, requires_grad=True)
    (g,) = torch.autograd.grad(F.cross_entropy(t, torch.from_numpy(LABELS), label_smoothing=0.1),
                               t, create_graph=True)
    (want,) = torch.autograd.grad((g * torch.from_numpy(v)).sum(), t)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


def test_a_plan_traced_without_ignored_labels_ignores_them_later() -> None:
    pb.manual_seed(0)
    model = nn.Dense(3, 5, dtype=np.float64)
    x = rng.standard_normal((4, 3))

    def loss(x, y):
        return nn.cross_entropy(model(x), y)

    step = pb.compile(loss, x, np.array([0, 1, 2, 3]), mode=pb.LoweringMode.TRAINING)
    for labels in (LABELS, np.full(4, -100)):
        model.weight.grad = model.bias.grad = None
        value = step(x, labels)
        grad = model.weight.grad.numpy().copy()
        t = torch.tensor(x @ model.weight.numpy().T + model.bias.numpy(), requires_grad=True)
        want = F.cross_entropy(t, torch.from_numpy(labels))
        want.backward()
        np.testing.assert_allclose(value.item(), want.item(), rtol=1e-12)
        np.testing.assert_allclose(grad, (t.grad.numpy().T @ x), rtol=1e-12, atol=1e-15)
    assert np.isnan(value.item())  # every label ignored: 0 / 0, as PyTorch


@pytest.mark.parametrize("call, error, match", [
    (lambda: nn.cross_entropy(pb.zeros(2, 4), np.array([0, 4])), pb.KernelError,
     r"^cross_entropy: \(2, 4\) and \(2,\): labels must lie in \[0, 4\) or be ignore_index "
     r"\(-100\), got values from 0 to 4 \(dtypes float32 and int64\)"),
    (lambda: nn.cross_entropy(pb.zeros(2, 4, 3), np.array([0, 1])), pb.KernelError,
     r"^cross_entropy: .*the input needs labels of shape \(2, 3\)"),
    (lambda: nn.cross_entropy(pb.zeros(2, 4), np.zeros((2, 3), np.float32)), pb.KernelError,
     r"^cross_entropy: .*class probabilities must have the logits' shape \(2, 4\)"),
    (lambda: nn.cross_entropy(pb.zeros(2, 4), np.zeros((2, 4))), pb.KernelError,
     r"^cross_entropy: .*class probabilities must have the logits' dtype"),
    (lambda: nn.cross_entropy(pb.zeros(2, 4), np.array([0, 1]), reduction="avg"), ValueError,
     r"^cross_entropy: reduction must be 'mean', 'sum' or 'none', not 'avg'"),
    (lambda: nn.cross_entropy(pb.zeros(2, 4), np.array([0, 1]), label_smoothing=1.5),
     ValueError, r"^cross_entropy: label_smoothing must be a number in \[0, 1\]"),
    (lambda: nn.nll_loss(pb.zeros(2, 4), np.array([0.0, 1.0])), pb.KernelError,
     r"^nll_loss: .*labels must be integers"),
    (lambda: nn.nll_loss(pb.zeros(2, 4), np.array([0, 1]), reduction="Mean"), ValueError,
     r"^nll_loss: reduction"),
    (lambda: nn.mse_loss(pb.zeros(2, 4), pb.zeros(4, 2)), pb.KernelError,
     r"^mse_loss: \(2, 4\) and \(4, 2\): input and target must have the same shape"),
    (lambda: nn.l1_loss(pb.zeros(2), np.zeros(2)), pb.KernelError,
     r"^l1_loss: .*must be floating, of one dtype \(dtypes float32 and float64\)"),
    (lambda: nn.huber_loss(pb.zeros(2), pb.zeros(2), delta=0.0), ValueError,
     r"^huber_loss: delta must be positive"),
    (lambda: nn.smooth_l1_loss(pb.zeros(2), pb.zeros(2), reduction=None), ValueError,
     r"^smooth_l1_loss: reduction"),
    (lambda: nn.binary_cross_entropy_with_logits(pb.zeros(2, 3), pb.zeros(2, 3),
                                                 pos_weight=pb.zeros(2)), pb.KernelError,
     r"^binary_cross_entropy_with_logits: .*pos_weight must broadcast to the input's shape"),
    (lambda: nn.binary_cross_entropy_with_logits(pb.zeros(2), np.array([0, 1])), pb.KernelError,
     r"^binary_cross_entropy_with_logits: .*must be floating"),
])
def test_bad_operands_are_refused_naming_the_loss(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()
