"""nn.Embedding against torch.nn.Embedding with copied weights: outputs, the weight's
gradient (repeated ids accumulate, the padding row gets none), SGD steps, a torch
state dict loaded through NumPy, a training plan fed new ids, initialization and bad
arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback import nn, optim

IDS = np.array([[1, 4, 4, 0], [2, 1, 4, 4]])  # repeated ids; 4 is the padding row below


def _twins(padding_idx, dtype):
    torch.manual_seed(0)
    reference = torch.nn.Embedding(6, 3, padding_idx=padding_idx).to(
        torch.float64 if dtype == np.float64 else torch.float32)
    layer = nn.Embedding(6, 3, padding_idx=padding_idx, dtype=dtype)
    layer.load_state_dict({k: v.detach().numpy() for k, v in reference.state_dict().items()})
    return layer, reference


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("padding_idx", [None, 4, -2])
def test_embedding_matches_torch_over_sgd_steps(padding_idx, dtype) -> None:
    layer, reference = _twins(padding_idx, dtype)
    opt = optim.SGD(layer.parameters(), 0.5)
    topt = torch.optim.SGD(reference.parameters(), 0.5)
    rng = np.random.default_rng(1)
    tol = 1e-6 if dtype == np.float32 else 1e-13
    for _ in range(3):
        g = rng.standard_normal(IDS.shape + (3,)).astype(dtype)
        out = layer(pb.tensor(IDS))
        want = reference(torch.from_numpy(IDS))
        np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=tol, atol=tol)
        opt.zero_grad()
        topt.zero_grad()
        (out * pb.tensor(g)).sum().backward()
        (want * torch.from_numpy(g)).sum().backward()
        np.testing.assert_allclose(layer.weight.grad.numpy(), reference.weight.grad.numpy(),
                                   rtol=tol, atol=tol)
        opt.step()
        topt.step()
    np.testing.assert_allclose(layer.weight.numpy(), reference.weight.detach().numpy(),
                               rtol=tol, atol=tol)
    if padding_idx is not None:
        assert not layer.weight.grad.numpy()[4].any()
        assert not layer.weight.numpy()[4].any()  # zero at init, never updated


def test_a_nonzero_padding_row_is_read_but_not_trained() -> None:
    layer, reference = _twins(4, np.float64)
    with torch.no_grad():
        reference.weight[4] = 3.0
    layer.load_state_dict({"weight": reference.weight.detach().numpy()})
    out = layer(IDS)  # a NumPy array of ids works too
    np.testing.assert_array_equal(out.numpy(), reference(torch.from_numpy(IDS)).detach().numpy())
    out.sum().backward()
    assert not layer.weight.grad.numpy()[4].any() and layer.weight.grad.numpy()[1].all()


def test_a_training_plan_reads_new_ids_and_keeps_the_padding_row_untrained() -> None:
    layer, _ = _twins(2, np.float64)
    step = pb.compile(lambda ids: (layer(ids) ** 2).sum(), IDS,
                      mode=pb.LoweringMode.TRAINING)
    step(IDS)
    layer.weight.grad = None
    ids = np.array([[2, 2, 5, 1], [0, 2, 5, 5]])
    value = step(ids)
    got = layer.weight.grad.numpy().copy()
    layer.weight.grad = None
    eager = (layer(ids) ** 2).sum()
    eager.backward()
    np.testing.assert_allclose(value.item(), eager.item(), rtol=1e-13)
    np.testing.assert_allclose(got, layer.weight.grad.numpy(), rtol=1e-13)
    assert not got[2].any() and got[5].all()


def test_initialization_state_dict_and_repr_follow_torch() -> None:
    pb.manual_seed(3)
    layer = nn.Embedding(4000, 8, padding_idx=-1)
    weight = layer.weight.numpy()
    assert layer.padding_idx == 3999 and not weight[3999].any()
    assert abs(weight[:-1].mean()) < 0.02 and abs(weight[:-1].std() - 1.0) < 0.02  # N(0, 1)
    assert list(layer.state_dict()) == list(torch.nn.Embedding(2, 2).state_dict()) == ["weight"]
    assert repr(layer) == "Embedding(4000, 8, padding_idx=3999)"


@pytest.mark.parametrize("make, match", [
    (lambda: nn.Embedding(-1, 3), "^Embedding: num_embeddings must be a non-negative int"),
    (lambda: nn.Embedding(5, 2.5), "^Embedding: embedding_dim"),
    (lambda: nn.Embedding(5, 3, padding_idx=5), r"^Embedding: padding_idx must be an int in "
                                                r"\[-5, 5\), got 5"),
])
def test_bad_sizes_are_refused(make, match) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_ids_out_of_range_and_float_ids_are_refused() -> None:
    layer = nn.Embedding(5, 2)
    with pytest.raises(pb.KernelError, match=r"^take: \(5, 2\) and \(2,\): indices must lie in "
                                             r"\[-5, 5\) .*got values from 0 to 5"):
        layer(np.array([0, 5]))
    with pytest.raises(pb.KernelError, match="indices must be an integer tensor"):
        layer(pb.tensor([0.0, 1.0]))
