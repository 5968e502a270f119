"""BatchNorm1d and BatchNorm2d against PyTorch's, from a loaded PyTorch state dict,
over several SGD steps in training mode (outputs, input and parameter gradients,
running statistics, num_batches_tracked), then in eval mode; and their errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback import nn

DTYPES = {"f32": (np.float32, torch.float32, 2e-5), "f64": (np.float64, torch.float64, 1e-11)}
STEPS, LR = 3, 0.1

# name: (pullback class, keyword arguments, input shape)
CASES = {
    "1d_rows": (nn.BatchNorm1d, {}, (6, 3)),
    "1d_sequence_cumulative_no_affine": (nn.BatchNorm1d, {"momentum": None, "affine": False},
                                         (2, 3, 5)),
    "2d": (nn.BatchNorm2d, {"momentum": 0.3, "eps": 1e-3}, (2, 3, 3, 4)),
    "2d_without_running_stats": (nn.BatchNorm2d, {"track_running_stats": False},
                                 (2, 3, 2, 3)),
}


def _torch_twin(kind: type, kwargs: dict, dtype: torch.dtype) -> torch.nn.Module:
    """The PyTorch layer, with random parameters and running statistics (not its
    initial ones, which would hide a swapped or skipped copy)."""
    twin = getattr(torch.nn, kind.__name__)(3, **kwargs).to(dtype)
    rng = np.random.default_rng(2)
    with torch.no_grad():
        for name, value in twin.state_dict().items():
            if name == "num_batches_tracked":
                value.fill_(4)
            else:
                fresh = rng.uniform(0.5, 1.5, value.shape) if name == "running_var" else \
                    rng.standard_normal(value.shape)
                value.copy_(torch.from_numpy(fresh))
    return twin


def _state(module: torch.nn.Module) -> dict:
    return {name: value.numpy().copy() for name, value in module.state_dict().items()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_batch_norm_trains_and_evaluates_as_torch(case: str, dtype: str) -> None:
    np_dtype, torch_dtype, tol = DTYPES[dtype]
    kind, kwargs, shape = CASES[case]
    twin = _torch_twin(kind, kwargs, torch_dtype)
    module = kind(3, dtype=np_dtype, **kwargs)
    module.load_state_dict(_state(twin))
    rng = np.random.default_rng(3)

    def close(got: np.ndarray, want: np.ndarray, what: str) -> None:
        assert got.dtype == want.dtype, what
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)

    for step in range(STEPS):
        x0 = (rng.standard_normal(shape) * 2 + 1).astype(np_dtype)
        g = rng.standard_normal(shape).astype(np_dtype)
        x, xt = pb.tensor(x0, requires_grad=True), torch.tensor(x0, requires_grad=True)
        y, yt = module(x), twin(xt)
        close(y.numpy(), yt.detach().numpy(), f"step {step}: output")
        (y * pb.tensor(g)).sum().backward()
        (yt * torch.from_numpy(g)).sum().backward()
        close(x.grad.numpy(), xt.grad.numpy(), f"step {step}: input gradient")
        with pb.no_grad(), torch.no_grad():
            for (name, p), tp in zip(module.named_parameters(), twin.parameters(), strict=True):
                close(p.grad.numpy(), tp.grad.numpy(), f"step {step}: {name} gradient")
                p.sub_(p.grad * LR)
                tp.sub_(tp.grad * LR)
                p.grad, tp.grad = None, None
        state = module.state_dict()
        assert state.keys() == twin.state_dict().keys()
        for name, want in _state(twin).items():
            close(state[name].numpy(), want, f"step {step}: {name}")
    module.eval(), twin.eval()
    x0 = rng.standard_normal(shape).astype(np_dtype)
    close(module(pb.tensor(x0)).numpy(), twin(torch.from_numpy(x0)).detach().numpy(),
          "eval output")


def test_state_dict_has_torch_names_and_an_int64_counter() -> None:
    state = nn.BatchNorm2d(4).state_dict()
    assert list(state) == list(torch.nn.BatchNorm2d(4).state_dict())
    assert state["num_batches_tracked"].dtype == np.int64
    assert state["num_batches_tracked"].shape == ()
    assert list(nn.BatchNorm1d(4, affine=False, track_running_stats=False).state_dict()) == []


def test_running_statistics_take_no_part_in_the_gradient() -> None:
    # The update happens in place while x's graph is pending, and does not enter it.
    module = nn.BatchNorm1d(2, dtype=np.float64)
    x = pb.tensor(np.arange(8.0).reshape(4, 2), requires_grad=True)
    module(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.zeros((4, 2)), atol=1e-12)
    np.testing.assert_allclose(module.running_mean.numpy(), [0.3, 0.4])


def test_batch_norm_errors_name_the_layer_or_op() -> None:
    with pytest.raises(ValueError, match=r"BatchNorm2d: expected a 4-D input .*C = 3.*\(2, 3\)"):
        nn.BatchNorm2d(3)(pb.zeros(2, 3))
    with pytest.raises(ValueError, match=r"BatchNorm1d: expected a 2-D or 3-D input"):
        nn.BatchNorm1d(3)(pb.zeros(2, 3, 4, 5))
    with pytest.raises(pb.KernelError, match=r"batch_norm: .*more than one value per channel"):
        nn.BatchNorm1d(3)(pb.zeros(1, 3))
    with pytest.raises(pb.KernelError,
                       match=r"batch_norm: \(2, 3\) and \(4,\).*running_mean must have shape \(3,"):
        nn.BatchNorm1d(4)(pb.zeros(2, 3))
    with pytest.raises(pb.KernelError, match=r"batch_norm: \(2, 3\): eval mode .*running_mean"):
        pb.batch_norm(pb.zeros(2, 3), None, None)
    with pytest.raises(pb.KernelError, match=r"running_mean .*must be tensors"):
        pb.batch_norm(pb.zeros(2, 3), np.zeros(3, np.float32), None, training=True)


def test_compiled_eval_batch_norm_matches_eager() -> None:
    module = nn.BatchNorm2d(3)
    x = np.random.default_rng(5).standard_normal((2, 3, 2, 2)).astype(np.float32)
    module(pb.tensor(x))  # running statistics away from their initial values
    module.eval()
    np.testing.assert_allclose(pb.compile(module, x)(x), module(pb.tensor(x)).numpy(),
                               rtol=1e-6, atol=1e-6)
    # Training mode's plans update the statistics: tests/lower/test_plan_state.py.


def test_an_empty_batch_counts_but_leaves_the_statistics_as_torch() -> None:
    module, twin = nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    assert module(pb.zeros(0, 3)).shape == tuple(twin(torch.zeros(0, 3)).shape) == (0, 3)
    for name, want in _state(twin).items():
        np.testing.assert_array_equal(module.state_dict()[name].numpy(), want, err_msg=name)
