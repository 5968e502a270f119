"""Plans carry module state: buffers a module writes in forward (BatchNorm's running
statistics and counter) are written back at every call of a plan, as eager does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pullback as pb
from pullback import nn, optim

TRAINING = pb.LoweringMode.TRAINING
STATS = ("running_mean", "running_var", "num_batches_tracked")


def _models() -> tuple[nn.Module, torch.nn.Module]:
    pb.manual_seed(0)
    ours = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Dense(3 * 2 * 2, 4))
    torch.manual_seed(0)
    twin = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3, padding=1), torch.nn.BatchNorm2d(3),
                               torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                               torch.nn.Linear(3 * 2 * 2, 4)).double()
    with torch.no_grad():
        for name, value in ours.state_dict().items():
            twin.state_dict()[name].copy_(torch.from_numpy(np.array(value.numpy())))
    return ours, twin


def _batches(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((6, 1, 4, 4)).astype(np.float32) * 2 + 1,
             rng.integers(0, 4, 6)) for _ in range(steps)]


def _close(ours: nn.Module, twin: torch.nn.Module, what: str) -> None:
    theirs = twin.state_dict()
    for name, value in ours.state_dict().items():
        np.testing.assert_allclose(value.numpy(), theirs[name].numpy(), rtol=2e-4, atol=2e-5,
                                   err_msg=f"{what}: {name}")


def test_a_compiled_batch_norm_trains_as_eager_and_torch_over_30_steps() -> None:
    planned, twin = _models()
    eager, _ = _models()
    data = _batches(30)

    def loss_of(x, y):
        return nn.cross_entropy(planned(x), y)

    plan = pb.compile(loss_of, *data[0], mode=TRAINING)
    # Tracing does not update: the statistics are as they were made.
    np.testing.assert_array_equal(planned[1].running_mean.numpy(), np.zeros(3))
    assert int(planned[1].num_batches_tracked.item()) == 0
    opt_plan = optim.SGD(planned.parameters(), 0.1)
    opt_eager = optim.SGD(eager.parameters(), 0.1)
    opt_torch = torch.optim.SGD(twin.parameters(), 0.1)
    for x, y in data:
        opt_plan.zero_grad()
        loss_plan = plan(x, y)
        opt_plan.step()
        opt_eager.zero_grad()
        loss_eager = nn.cross_entropy(eager(pb.tensor(x)), y)
        loss_eager.backward()
        opt_eager.step()
        opt_torch.zero_grad()
        loss_torch = torch.nn.functional.cross_entropy(
            twin(torch.from_numpy(x).double()), torch.from_numpy(y))
        loss_torch.backward()
        opt_torch.step()
        np.testing.assert_allclose(loss_plan.item(), loss_eager.item(), rtol=1e-5)
        np.testing.assert_allclose(loss_plan.item(), loss_torch.item(), rtol=2e-4)
    assert int(planned[1].num_batches_tracked.item()) == 30
    _close(planned, twin, "plan vs torch")
    _close(eager, twin, "eager vs torch")
    for (name, p), q in zip(planned.state_dict().items(), eager.state_dict().values()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("momentum", [0.3, None])  # None: the cumulative average
def test_an_inference_plan_in_train_mode_updates_the_statistics_per_call(momentum) -> None:
    module = nn.BatchNorm2d(2, momentum=momentum)
    twin = torch.nn.BatchNorm2d(2, momentum=momentum)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((3, 2, 2, 2)).astype(np.float32) * 3 + 2 for _ in range(3)]
    plan = pb.compile(module, xs[0])
    assert int(module.num_batches_tracked.item()) == 0
    assert plan.explain().count("written back into the buffer") == 3
    for x in xs:
        np.testing.assert_allclose(plan(x).numpy(), twin(torch.from_numpy(x)).detach().numpy(),
                                   rtol=1e-5, atol=1e-5)
        _close(module, twin, "train mode")
    assert int(module.num_batches_tracked.item()) == 3
    # Eval mode then normalizes with the statistics the plan gathered.
    module.eval()
    twin.eval()
    x = xs[0] - 1
    np.testing.assert_allclose(pb.compile(module, x)(x).numpy(),
                               twin(torch.from_numpy(x)).detach().numpy(), rtol=1e-5,
                               atol=1e-5)


def test_a_buffer_read_after_its_write_reads_the_new_value() -> None:
    counter = pb.zeros(2)

    def fn(x):
        counter.add_(x)
        counter.mul_(2.0)
        return x + counter  # reads the written value, as eager would

    plan = pb.compile(fn, np.ones(2, np.float32))
    np.testing.assert_array_equal(counter.numpy(), [0.0, 0.0])
    np.testing.assert_array_equal(plan(np.ones(2, np.float32)).numpy(), [3.0, 3.0])
    np.testing.assert_array_equal(plan(np.ones(2, np.float32)).numpy(), [7.0, 7.0])
    np.testing.assert_array_equal(counter.numpy(), [6.0, 6.0])
