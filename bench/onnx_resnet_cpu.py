"""ResNet-50 (onnx's `light` model) on one thread, in CPU time: pullback's inference plan
with batch norms folded into the convolutions and their epilogues fused, against the
same tree's plan without (both switched off while it is lowered), taking turns.

CPU time (`time.process_time`) of a single-threaded process counts the work done,
not the wait for a core, so on a machine shared with other jobs it moves far less
than wall time (which grew 20x under a load of 10 on 2 cores here). Both plans' outputs
are compared; `--layers N` adds each plan's steps timed in CPU time, best of N calls,
convolutions by shape with GFLOP per CPU second (bench/layer_profile.py).
Run: `python bench/onnx_resnet_cpu.py [--repeats 12] [--layers 8]`.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import numpy as np
import onnx
import onnx_resnet as bench
from layer_profile import layer_profile

import pullback.onnx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=12, help="calls per plan (best kept)")
    parser.add_argument("--layers", type=int, default=0, metavar="N",
                        help="time each plan's steps, best of N calls")
    args = parser.parse_args()
    proto = onnx.load(os.path.join(bench.data_dir(), "light", "light_resnet50.onnx"))
    inits = {t.name for t in proto.graph.initializer}
    (spec,) = [i for i in proto.graph.input if i.name not in inits]
    x = bench.dummy_input(spec)
    data, _ = bench.with_logits(proto)
    fused = pullback.onnx.load(data)
    fused(x)
    models = {"folded and fused": fused, "unfolded": bench.unfolded(data, x)}
    ours, plain = (np.asarray(m(x)[1]) for m in models.values())
    print(f"logits: max |fused - unfolded| / max |unfolded| "
          f"{np.abs(ours - plain).max() / np.abs(plain).max():.1e}")
    best = dict.fromkeys(models, float("inf"))
    for r in range(args.repeats):
        for name in list(models)[::1 if r % 2 == 0 else -1]:
            start = time.process_time()
            models[name](x)
            best[name] = min(best[name], time.process_time() - start)
    first, second = best.values()
    print(f"CPU time per inference, one thread, best of {args.repeats}: " + ", ".join(
        f"{name} {t * 1e3:.1f} ms" for name, t in best.items())
        + f"; ratio {first / second:.3f}")
    for name, model in models.items() if args.layers else ():
        (runner,) = model._runners.values()
        print(f"\nsteps of the {name} plan, CPU time, best of {args.layers} calls:")
        print(layer_profile(runner.plan, lambda m=model: m(x), args.layers, time.process_time))


if __name__ == "__main__":
    main()
