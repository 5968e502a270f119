"""LSTM and GRU forward + backward against PyTorch eager, every library on 2 threads.

One layer, N=32, T=50, input 64, hidden 128, batch first, the loss the sum of the
output; pullback eager, pullback through a TRAINING plan (`pb.compile`), PyTorch
eager (its fused CPU LSTM), same weights and data. Run: `python bench/recurrent.py`
(`python bench/recurrent.py 1` for one thread each).
"""

from __future__ import annotations

import json
import sys

from common import both_ways, pin_threads

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
pin_threads(THREADS)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import pullback as pb  # noqa: E402
from pullback import nn  # noqa: E402

N, T, IN, H = 32, 50, 64, 128


def contenders(kind: str) -> dict:
    pb.manual_seed(0)
    layer = getattr(nn, kind)(IN, H)
    twin = getattr(torch.nn, kind)(IN, H, batch_first=True)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            getattr(twin, name).copy_(torch.from_numpy(p.numpy().copy()))
    x = np.random.default_rng(0).standard_normal((N, T, IN)).astype(np.float32)
    xt = torch.from_numpy(x)

    def loss(x: pb.Tensor) -> pb.Tensor:
        return pb.sum(layer(x)[0])

    plan = pb.compile(loss, x, mode=pb.LoweringMode.TRAINING)

    def eager() -> None:
        loss(pb.tensor(x)).backward()

    def planned() -> None:
        plan(x)

    def torch_eager() -> None:
        twin(xt)[0].sum().backward()

    eager()
    grads = [p.grad.numpy().copy() for p in layer.parameters()]
    for p in layer.parameters():
        p.grad = None
    planned()
    torch_eager()
    for g, p, tp in zip(grads, layer.parameters(), twin.parameters()):
        scale = float(np.abs(g).max())  # float32 sums over 1600 rows, in different orders
        np.testing.assert_allclose(g, tp.grad.numpy(), rtol=1e-4, atol=1e-5 * scale)
        np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-4, atol=1e-5 * scale)
    return {"pullback eager": eager, "pullback plan": planned, "torch eager": torch_eager}


def main() -> None:
    torch.set_num_threads(THREADS)
    results = {}
    for kind in ("LSTM", "GRU"):
        times = both_ways(contenders(kind), repeats=5, number=5)
        results[kind] = {way: {name: round(t * 1e3, 2) for name, t in ts.items()}
                         for way, ts in times.items()}
        alone = times["alone"]
        results[kind]["torch / pullback (alone)"] = {
            name: round(alone["torch eager"] / alone[name], 2)
            for name in ("pullback eager", "pullback plan")}
    print(json.dumps({"threads": THREADS, "shape": {"N": N, "T": T, "input": IN, "hidden": H},
                      "ms per forward+backward": results}, indent=2))


if __name__ == "__main__":
    main()
