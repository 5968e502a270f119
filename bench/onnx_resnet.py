"""ResNet-50 (onnx's bundled `light` model) inference: pullback against onnxruntime.

The input is what onnx's backend test runner feeds light models (`arange(n) / n`
shaped 1x3x224x224, float32; `tests/onnx/conformance.py` does the same). Both
run on two threads: onnxruntime with intra-op 2 and inter-op 1, pullback with
NumPy's BLAS pinned to 2. Best-of-N wall time per inference, both in one run,
taking turns (the machine's load changes from second to second);
the outputs are checked against each other and the file's expected output.
`--profile` adds a cProfile of pullback's call (what the time goes to), `--layers N`
a table of the plan's steps timed one by one, best of N calls: convolutions by shape
with their GFLOP/s (bench/layer_profile.py). Run with another tree's pullback
(`PYTHONPATH=<tree> python bench/onnx_resnet.py --layers 8`) for a before and after.
`--unfolded` times, taking turns with the others, the plan built without folding
batch norms into convolutions and without epilogues (a before and after in one run).
Run: `python bench/onnx_resnet.py [--repeats 10] [--number 2] [--profile] [--layers 8]
[--unfolded]`.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

from common import pin_threads
from layer_profile import layer_profile

pin_threads(2)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime  # noqa: E402

import pullback.onnx  # noqa: E402

PAUSE_S = 0.2
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "onnx"))
from conformance import data_dir, dummy_input  # noqa: E402


def interleaved_best(fns: dict, repeats: int, number: int) -> dict:
    """Seconds per call, best of `repeats` runs of `number` calls each, the contenders
    taking turns (in rotating order) so that all see the same machine load, with a pause
    between turns so that one's spinning worker threads are idle when the next starts."""
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()  # warm up
    names = list(fns)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            time.sleep(PAUSE_S)
            start = time.perf_counter()
            for _ in range(number):
                fns[name]()
            best[name] = min(best[name], (time.perf_counter() - start) / number)
    return best


def with_logits(proto: onnx.ModelProto) -> tuple[bytes, str]:
    """The model with the input of its final node (the logits before the softmax) as a
    second output: the light model's constant weights make its softmax uniform, so the
    logits are the telling comparison."""
    last = proto.graph.node[-1]
    inferred = onnx.shape_inference.infer_shapes(proto)
    (info,) = [v for v in inferred.graph.value_info if v.name == last.input[0]]
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    copy.graph.output.append(info)
    return copy.SerializeToString(), info.name


def unfolded(model_bytes: bytes, x: np.ndarray) -> object | None:
    """The model with its plan built as before folding and epilogues (this tree's code,
    both switched off while it is lowered), for a before and after in one run; None on a
    tree without them."""
    import pullback.lower.plan as lowering

    if not hasattr(lowering, "fold_into_convolutions"):
        return None
    fold, schedule = lowering.fold_into_convolutions, lowering.schedule
    lowering.fold_into_convolutions = lambda graph: []
    lowering.schedule = lambda graph, keep, epilogues=False: schedule(graph, keep)
    try:
        plain = pullback.onnx.load(model_bytes)
        plain(x)
    finally:
        lowering.fold_into_convolutions, lowering.schedule = fold, schedule
    return plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="timed runs (best kept)")
    parser.add_argument("--number", type=int, default=2, help="inferences per timed run")
    parser.add_argument("--profile", action="store_true", help="cProfile pullback's call")
    parser.add_argument("--unfolded", action="store_true",
                        help="also time the plan without folding and epilogues, in turns")
    parser.add_argument("--layers", type=int, default=0, metavar="N",
                        help="time the plan's steps one by one, best of N calls")
    args = parser.parse_args()

    path = os.path.join(data_dir(), "light", "light_resnet50.onnx")
    proto = onnx.load(path)
    inits = {t.name for t in proto.graph.initializer}
    (spec,) = [i for i in proto.graph.input if i.name not in inits]
    x = dummy_input(spec)
    expected = onnx.numpy_helper.to_array(onnx.load_tensor(
        os.path.join(data_dir(), "light", "light_resnet50_output_0.pb")))

    model_bytes, logits_name = with_logits(proto)
    start = time.perf_counter()
    model = pullback.onnx.load(model_bytes)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    model(x)  # traces and builds the plan
    first_s = time.perf_counter() - start

    sessions = {}
    for spinning in ("1", "0"):  # onnxruntime's default, and its workers sleeping when idle
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 2
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        sessions[spinning] = onnxruntime.InferenceSession(model_bytes, options,
                                                          providers=["CPUExecutionProvider"])
    theirs = sessions["1"].run(None, {spec.name: x})

    ours = [np.asarray(v) for v in model(x)]
    print(f"input {spec.name} {x.shape} {x.dtype}; output {ours[0].shape} {ours[0].dtype}")
    for name, a, b in (("softmax", ours[0], theirs[0]), (f"logits {logits_name}", ours[1],
                                                         theirs[1])):
        scale = np.abs(b).max()
        print(f"{name}: max |pullback - onnxruntime| {np.abs(a - b).max():.2e} "
              f"(max |onnxruntime| {scale:.2e}; relative {np.abs(a - b).max() / scale:.1e})")
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5 * scale)
    print(f"max |pullback - expected output| {np.abs(ours[0] - expected).max():.2e}")
    np.testing.assert_allclose(ours[0], expected, rtol=1e-3, atol=1e-7)

    feeds = {spec.name: x}
    contenders = {
        "pullback": lambda: model(x),
        "onnxruntime": lambda: sessions["1"].run(None, feeds),
        "onnxruntime, no spinning": lambda: sessions["0"].run(None, feeds),
    }
    plain = unfolded(model_bytes, x) if args.unfolded else None
    if plain is not None:
        np.testing.assert_allclose(np.asarray(plain(x)[1]), ours[1], rtol=1e-4)
        contenders["pullback, unfolded"] = lambda: plain(x)
    times = interleaved_best(contenders, args.repeats, args.number)
    t_pb, t_spin, t_sleep = times["pullback"], times["onnxruntime"], \
        times["onnxruntime, no spinning"]
    t_ort = min(t_spin, t_sleep)
    if plain is not None:
        t_plain = times["pullback, unfolded"]
        print(f"pullback without folding and epilogues (--unfolded) {t_plain * 1e3:.1f} ms; "
              f"ratio with / without {t_pb / t_plain:.2f}")
    print(f"pullback load {load_s * 1e3:.0f} ms, first call (trace + plan) {first_s * 1e3:.0f} ms")
    print(f"best of {args.repeats} x {args.number} per inference: pullback {t_pb * 1e3:.1f} ms, "
          f"onnxruntime {t_spin * 1e3:.1f} ms (spinning workers, its default), "
          f"{t_sleep * 1e3:.1f} ms (allow_spinning=0)")
    print(f"ratio pullback / onnxruntime (its faster setting): {t_pb / t_ort:.2f} "
          "(issue 15 aims at 1.0 or less)")

    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.number):
            model(x)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)

    if args.layers:
        for name, which in (("", model), (" without folding and epilogues", plain)):
            if which is not None:
                (runner,) = which._runners.values()
                print(f"steps of pullback's plan{name} ({pullback.__file__}), best of "
                      f"{args.layers} calls:")
                print(layer_profile(runner.plan, lambda m=which: m(x), args.layers))


if __name__ == "__main__":
    main()
