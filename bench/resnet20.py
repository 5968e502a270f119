"""One training step of ResNet-20 (He et al.'s CIFAR net) on 3x32x32, batch 64, against
PyTorch eager, BatchNorm in training mode, SGD (lr 0.01, momentum 0.9), every library on 2
threads.

ResNet-20: a 3x3 convolution to 16 channels + BatchNorm + ReLU, then three stages of
three basic blocks (16, 32, 64 channels), stride 2 at the start of stages 2 and 3 with
a 1x1 convolution + BatchNorm projection shortcut (option B), global average pooling
and a linear layer over 10 classes. The same network in pullback and torch.nn, the
same parameter and buffer names, pullback's initial weights copied into PyTorch's;
random data (fixed seed). Contenders: pullback through a TRAINING plan, pullback eager,
PyTorch eager. Before timing, three steps of each must give the same losses (1e-4
relative, float32) and the same running statistics.

Run: `python bench/resnet20.py` (`--threads=1` for one thread each; `--profile` adds a
cProfile of 10 plan steps, the functions by own time; `--layers` times each distinct
convolution and batch norm of the network alone, forward and backward, against
PyTorch's, for the convolution rework; `--processes` times each contender's "alone" runs
in a process of its own).
"""

from __future__ import annotations

import json
import sys

from common import (
    ALONE,
    both_ways,
    eager_sgd_step,
    pin_threads,
    plan_sgd_step,
    profile,
    torch_sgd_step,
)

THREADS = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--threads=")), 2))
pin_threads(THREADS)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import pullback as pb  # noqa: E402
from pullback import nn  # noqa: E402

BATCH, LR, MOMENTUM, STAGES = 64, 0.01, 0.9, (16, 32, 64)


class Block(nn.Module):
    """ResNet's basic block: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), the
    shortcut a 1x1 convolution + BatchNorm where the width or the stride changes."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else None)

    def forward(self, x: object) -> object:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class TorchBlock(torch.nn.Module):
    """Block in torch.nn, the same names."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.relu = torch.nn.ReLU()
        self.shortcut = (torch.nn.Sequential(
            torch.nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
            torch.nn.BatchNorm2d(cout)) if stride != 1 or cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + (x if self.shortcut is None else self.shortcut(x)))


def resnet20(lib: object, block: type) -> object:
    """ResNet-20 from library `lib` (pullback.nn or torch.nn) with blocks of type `block`."""
    linear = getattr(lib, "Dense", None) or lib.Linear
    layers = [lib.Conv2d(3, STAGES[0], 3, padding=1, bias=False), lib.BatchNorm2d(STAGES[0]),
              lib.ReLU()]
    cin = STAGES[0]
    for stage, cout in enumerate(STAGES):
        for index in range(3):
            layers.append(block(cin, cout, 2 if stage and not index else 1))
            cin = cout
    layers += [lib.AdaptiveAvgPool2d(1), lib.Flatten(), linear(cin, 10)]
    return lib.Sequential(*layers)


def models() -> tuple:
    """(pullback model, its twin for eager, the torch model), the same weights."""
    pb.manual_seed(0)
    model = resnet20(nn, Block)
    twin = resnet20(nn, Block)
    twin.load_state_dict({k: v.numpy() for k, v in model.state_dict().items()})
    tmodel = resnet20(torch.nn, TorchBlock)
    tmodel.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                            for k, v in model.state_dict().items()})
    return model, twin, tmodel


def contenders() -> tuple:
    """The three steps, each returning its loss, and the three models."""
    model, twin, tmodel = models()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, BATCH)
    return {"pullback plan": plan_sgd_step(model, x, y, LR, MOMENTUM),
            "pullback eager": eager_sgd_step(twin, x, y, LR, MOMENTUM),
            "torch eager": torch_sgd_step(tmodel, None, x, y, LR, MOMENTUM)}, \
        (model, twin, tmodel)


def value(loss: object) -> float:
    return float(loss.detach() if isinstance(loss, torch.Tensor) else np.asarray(loss))


def check_gradients() -> None:
    """One step's parameter gradients, pullback eager against PyTorch, in float64 (1e-9 of
    each tensor's largest entry). In float32 they differ by up to 2% of it (10.conv1's
    weight; float32 sums in other orders, amplified by 19 batch norms' backward) while
    float64 agrees to 1e-13: the float32 check is the losses'."""
    _, twin, tmodel = models()
    twin, tmodel = twin.double(), tmodel.double()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 3, 32, 32))
    y = rng.integers(0, 10, BATCH)
    nn.cross_entropy(twin(pb.tensor(x)), y).backward()
    torch.nn.functional.cross_entropy(tmodel(torch.from_numpy(x)), torch.from_numpy(y)).backward()
    grads = dict(twin.named_parameters())
    for name, p in tmodel.named_parameters():
        want = p.grad.numpy()
        np.testing.assert_allclose(grads[name].grad.numpy(), want, rtol=1e-9,
                                   atol=1e-9 * float(np.abs(want).max()), err_msg=name)


def check(steps: dict, nets: tuple) -> list:
    """Three float32 steps of each contender: the same losses and running statistics.
    The losses drift apart by about 10x a step at this learning rate (float32 rounding,
    amplified: 2e-7, 1e-6, 1.5e-5 relative in steps 2 to 4), the plan's and eager
    pullback's staying equal; at lr 0.05 the third step was 2e-4 apart."""
    losses = {name: [value(step()) for _ in range(3)] for name, step in steps.items()}
    ref = losses["torch eager"]
    for name in ("pullback plan", "pullback eager"):
        np.testing.assert_allclose(losses[name], ref, rtol=1e-4, err_msg=name)
    model, twin, tmodel = nets
    torch_state = tmodel.state_dict()
    for net in (model, twin):
        for key, t in net.state_dict().items():
            if "running" in key or "num_batches" in key:
                # After 3 steps apart by float32 rounding: up to 1.3e-5 in a running
                # mean of magnitude 0.02 (3.bn1), the weights having drifted as the losses.
                np.testing.assert_allclose(t.numpy(), torch_state[key].numpy(), rtol=1e-3,
                                           atol=1e-4, err_msg=key)
    return ref


# Each distinct convolution of ResNet-20: (in, out, kernel, stride, input size, count).
CONVS = [(3, 16, 3, 1, 32, 1), (16, 16, 3, 1, 32, 6), (16, 32, 3, 2, 32, 1),
         (32, 32, 3, 1, 16, 5), (16, 32, 1, 2, 32, 1), (32, 64, 3, 2, 16, 1),
         (64, 64, 3, 1, 8, 5), (32, 64, 1, 2, 16, 1)]
BATCH_NORMS = [(16, 32, 7), (32, 16, 7), (64, 8, 7)]  # (channels, size, count)


def conv_times(be: object, cin: int, cout: int, k: int, stride: int, size: int) -> list:
    """ms of one convolution's forward, input and weight backward: pullback, then torch."""
    from common import best_time

    rng = np.random.default_rng(0)
    pad, out = k // 2, size // stride
    x = rng.standard_normal((BATCH, cin, size, size)).astype(np.float32)
    w = rng.standard_normal((cout, cin, k, k)).astype(np.float32)
    u = rng.standard_normal((BATCH, cout, out, out)).astype(np.float32)
    xt, wt, ut = (torch.from_numpy(a) for a in (x, w, u))
    st, pd = (stride, stride), (pad, pad)
    backward = torch.ops.aten.convolution_backward  # what autograd runs
    return [best_time(fn, 3, 3) * 1e3 for fn in (
        lambda: be.conv2d(x, w, st, pd),
        lambda: be.conv2d_input_backward(u, w, x.shape, st, pd),
        lambda: be.conv2d_weight_backward(u, x, w.shape, st, pd),
        lambda: torch.nn.functional.conv2d(xt, wt, stride=stride, padding=pad),
        lambda: backward(ut, xt, wt, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1,
                         [True, False, False]),
        lambda: backward(ut, xt, wt, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1,
                         [False, True, False]))]


def batch_norm_times(be: object, channels: int, size: int) -> list:
    """ms of one training-mode batch norm's forward and backward: pullback, then torch."""
    from common import best_time

    x = np.random.default_rng(0).standard_normal((BATCH, channels, size, size))
    x = x.astype(np.float32)
    w, b = np.ones(channels, np.float32), np.zeros(channels, np.float32)
    xt = torch.from_numpy(x).requires_grad_()
    wt, bt = torch.from_numpy(w).requires_grad_(), torch.from_numpy(b).requires_grad_()
    yt = torch.nn.functional.batch_norm(xt, None, None, wt, bt, training=True)
    ut = torch.ones_like(yt)
    return [best_time(fn, 3, 5) * 1e3 for fn in (
        lambda: be.batch_norm(x, w, b, 1e-5),
        lambda: be.batch_norm_backward(x, x, w, 1e-5),
        lambda: torch.nn.functional.batch_norm(xt, None, None, wt, bt, training=True),
        lambda: torch.autograd.grad(yt, (xt, wt, bt), ut, retain_graph=True))]


def layers() -> None:
    """ms per call of each distinct layer, pullback's backend against PyTorch's ops."""
    from pullback.backend import CpuBackend

    be = CpuBackend()
    print(f"{'layer':34s} {'count':>5s} {'pb fwd':>7s} {'pb dx':>7s} {'pb dw':>7s} "
          f"{'pt fwd':>7s} {'pt dx':>7s} {'pt dw':>7s}  ms")
    for cin, cout, k, stride, size, count in CONVS:
        times = conv_times(be, cin, cout, k, stride, size)
        name = f"conv {cin}->{cout} {k}x{k} s{stride} at {size}x{size}"
        print(f"{name:34s} {count:5d} " + " ".join(f"{t:7.2f}" for t in times), flush=True)
    for channels, size, count in BATCH_NORMS:
        fwd, bwd, tfwd, tbwd = batch_norm_times(be, channels, size)
        name = f"batch norm {channels} at {size}x{size}"
        print(f"{name:34s} {count:5d} {fwd:7.2f} {bwd:7.2f} {'':7s} {tfwd:7.2f} {tbwd:7.2f}",
              flush=True)


def main() -> int:
    if "--layers" in sys.argv:
        torch.set_num_threads(THREADS)
        layers()
        return 0
    torch.set_num_threads(THREADS)
    if ALONE is None:  # (in an --alone process, only the one contender runs)
        check_gradients()
    steps, nets = contenders()
    losses = check(steps, nets) if ALONE is None else []
    ways = both_ways(steps, repeats=8, number=2)
    results = {way: {name: round(t * 1e3, 2) for name, t in ts.items()}
               for way, ts in ways.items()}
    results["torch / pullback"] = {
        way: {name: round(ts["torch eager"] / ts[name], 2)
              for name in ("pullback plan", "pullback eager")} for way, ts in ways.items()}
    print(json.dumps({"bench": "ResNet-20 training step, 3x32x32, batch 64, SGD momentum, "
                      f"float32, {THREADS} threads", "losses over 3 steps (torch)": losses,
                      "ms per step": results}, indent=2))
    if "--profile" in sys.argv:
        profile(steps["pullback plan"], 10, 25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
