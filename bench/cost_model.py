"""What data-parallel training should cost beyond one machine, on paper: the alpha-beta
model of a ring allreduce, for the wide MLP and ResNet-50 on 8 and 64 machines over 10 and
100 Gbit/s links, with communication overlapping the backward and without.

`python bench/cost_model.py` prints the Markdown tables docs/distributed.md holds;
`python bench/cost_model.py --step-ms 18 --backward-ms 12` replaces the wide MLP's step
and backward times (milliseconds per machine) with your own measurements.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

ALPHA_S = 25e-6  # one message's start-up cost over TCP on Ethernet (MPI's tcp BTL)
BUCKET_BYTES = 25 * 2**20  # DistributedOptimizer's default bucket, as PyTorch DDP's


@dataclass(frozen=True)
class Model:
    name: str
    parameters: int
    step_s: float  # forward + backward + update of one machine's batch
    backward_s: float  # the part communication can hide under

    @property
    def gradient_bytes(self) -> int:
        return 4 * self.parameters  # float32


def wide_mlp(step_ms: float = 15.4, backward_ms: float = 10.0) -> Model:
    # 784-1024-1024-10, batch 256 per machine: bench/RESULTS.md's 15.4 ms step on two
    # cores; the backward runs two GEMMs per layer to the forward's one, so about 2/3.
    return Model("wide MLP 784-1024-1024-10 (1.86 M parameters, 7.5 MB)", 1_863_690,
                 step_ms / 1e3, backward_ms / 1e3)


# ResNet-50 at batch 32 per machine on one accelerator: 32 x 3 x 4.1 GMAC = 0.79 TFLOP per
# step, about 100 ms at half of a 16 TFLOP/s float32 peak; backward about 2/3 of it.
RESNET50 = Model("ResNet-50 (25.6 M parameters, 102 MB)", 25_557_032, 0.100, 0.067)


def allreduce_seconds(nbytes: int, machines: int, link_gbit: float,
                      alpha_s: float = ALPHA_S) -> float:
    """A ring allreduce of `nbytes` over `machines`: reduce-scatter then allgather, each
    2(N-1)/2 messages of nbytes/N per process, so 2(N-1)/N of the bytes cross each link
    and 2(N-1) message latencies are paid, once per bucket."""
    if machines == 1:
        return 0.0
    buckets = -(-nbytes // BUCKET_BYTES)
    bandwidth = link_gbit * 1e9 / 8
    return (2 * (machines - 1) * alpha_s * buckets
            + 2 * (machines - 1) / machines * nbytes / bandwidth)


def step_seconds(model: Model, machines: int, link_gbit: float, overlap: bool) -> float:
    """Weak scaling (each machine keeps its batch): the step plus the allreduce, or with
    overlap only the part of the allreduce that outlasts the backward."""
    comm = allreduce_seconds(model.gradient_bytes, machines, link_gbit)
    exposed = max(0.0, comm - model.backward_s) if overlap else comm
    return model.step_s + exposed


def _scaling(model: Model, step_s: float, machines: int) -> str:
    """Efficiency (one machine's step over this step) and the speed-up in samples/s."""
    efficiency = model.step_s / step_s
    return f"{efficiency:.0%} ({machines * efficiency:.1f}x)"


def table(model: Model) -> list[str]:
    rows = [f"**{model.name}**, step {model.step_s * 1e3:.1f} ms per machine "
            f"(backward {model.backward_s * 1e3:.1f} ms)", "",
            "| machines | link | allreduce | step, no overlap | efficiency (speed-up) | "
            "step, overlap | efficiency (speed-up) |",
            "|---:|---:|---:|---:|---:|---:|---:|"]
    for machines in (8, 64):
        for link in (10, 100):
            comm = allreduce_seconds(model.gradient_bytes, machines, link)
            plain, hidden = (step_seconds(model, machines, link, o) for o in (False, True))
            rows.append(f"| {machines} | {link} Gbit/s | {comm * 1e3:.1f} ms | "
                        f"{plain * 1e3:.1f} ms | {_scaling(model, plain, machines)} | "
                        f"{hidden * 1e3:.1f} ms | {_scaling(model, hidden, machines)} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-ms", type=float, default=15.4,
                        help="the wide MLP's step on one machine (default: %(default)s)")
    parser.add_argument("--backward-ms", type=float, default=10.0,
                        help="its backward (default: %(default)s)")
    args = parser.parse_args()
    for model in (wide_mlp(args.step_ms, args.backward_ms), RESNET50):
        print("\n".join(table(model)))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
