"""The `pullback` command: `pullback train` trains the default model on the bundled
digits (or, with `--model gpt`, a character-level transformer on text);
`pullback sample` generates text from a GPT run; `pullback check` checks every
primitive's derivatives; `pullback run` runs an ONNX model on inputs saved with NumPy.

Each subcommand is an `_add_<name>` function that declares its arguments and
the function that runs it; `main` dispatches.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

from . import __version__
from .check.runner import BACKENDS, format_table, run_checks, summary

if TYPE_CHECKING:
    import numpy as np

    from .ad import Primitive
    from .ops.checks import Spec

    # What `main` adds subcommands to.
    Commands = argparse._SubParsersAction[argparse.ArgumentParser]


class _Injected(TypedDict):
    """What `main` passes every subcommand besides its arguments (`check` uses it)."""

    primitives: Mapping[str, Primitive] | None
    specs: Mapping[str, Spec] | None


def main(
    argv: Sequence[str] | None = None,
    *,
    primitives: Mapping[str, Primitive] | None = None,
    specs: Mapping[str, Spec] | None = None,
) -> int:
    """Run the command line; returns the exit status. `primitives` and `specs` replace
    the registry and the specs its primitives declare for `check` (for testing the
    command itself)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    injected: _Injected = {"primitives": primitives, "specs": specs}
    status: int = args.run(args, injected)
    return status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pullback", description="pullback: a deep-learning engine built around the "
        "backward pass.")
    parser.add_argument("--version", action="version", version=f"pullback {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_train(commands)
    _add_sample(commands)
    _add_check(commands)
    _add_run(commands)
    return parser


def _add_train(commands: Commands) -> None:
    from .gpt import MODEL as GPT_MODEL
    from .gpt import GPTConfig
    from .training import BACKENDS as TRAIN_BACKENDS
    from .training import MODELS, OPTIMIZERS, TrainConfig

    defaults, gpt = TrainConfig(), GPTConfig()
    train = commands.add_parser(
        "train", help="train the default model on the bundled digits data (or a GPT on text)",
        description="Train a small CNN (or an MLP, or a small ResNet with BatchNorm) on the "
        "8x8 digits shipped with pullback, "
        "evaluate it on the held-out split each epoch, and write a resumable checkpoint, the "
        "final weights and (with matplotlib) a plot of loss and accuracy to the output folder. "
        "The last line printed is the test accuracy. With --model gpt: a character-level "
        "transformer on text, ending with a sample and the validation loss per character. "
        "Under `mpirun -n N`: data-parallel on N processes with the same "
        "global batch; rank 0 prints and writes (docs/distributed.md).")
    train.add_argument("--model", choices=(*MODELS, GPT_MODEL), default=defaults.model)
    # These four default by model (digits: the first value, gpt: the second).
    train.add_argument("--epochs", type=int,
                       help=f"default: {defaults.epochs}, gpt: {gpt.epochs}")
    train.add_argument("--batch-size", type=int,
                       help=f"default: {defaults.batch_size}, gpt: {gpt.batch_size}")
    train.add_argument("--lr", type=float, help="peak learning rate, decayed along a cosine "
                       f"(default: {defaults.lr}, gpt: {gpt.lr})")
    train.add_argument("--optimizer", choices=OPTIMIZERS,
                       help=f"default: {defaults.optimizer}, gpt: {gpt.optimizer}")
    train.add_argument("--seed", type=int, default=defaults.seed)
    train.add_argument("--backend", choices=tuple(TRAIN_BACKENDS), default=defaults.backend)
    train.add_argument("--output", default=defaults.output, metavar="DIR",
                       help="folder for the checkpoint, weights and plot (default: %(default)s)")
    train.add_argument("--eager", action="store_true",
                       help="run eager autograd instead of a compiled training plan")
    again = train.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue from the checkpoint in the output folder")
    again.add_argument("--overwrite", action="store_true",
                       help="start again, replacing the checkpoint in the output folder")
    train.add_argument("--no-progress", dest="progress", action="store_false",
                       help="no progress bar")
    text = train.add_argument_group("--model gpt", "a character-level transformer trained "
                                    "on the standard library's .py files (or --text)")
    text.add_argument("--text", default=gpt.text, metavar="FILE",
                      help="train on this file (its last tenth validates) instead")
    for name, help_text in (("steps_per_epoch", "training steps between evaluations"),
                            ("context", "characters the model sees"),
                            ("width", "model width (d_model)"), ("heads", "attention heads"),
                            ("layers", "transformer layers")):
        text.add_argument("--" + name.replace("_", "-"), type=int, metavar="N",
                          default=getattr(gpt, name),
                          help=f"{help_text} (default: %(default)s)")
    train.set_defaults(run=_run_train, command_parser=train)


def _run_train(args: argparse.Namespace, injected: _Injected) -> int:
    from .gpt import MODEL as GPT_MODEL
    from .gpt import GPTConfig, GPTResult, train_gpt
    from .training import TrainConfig, TrainResult, train

    chosen = {k: getattr(args, k) for k in ("epochs", "batch_size", "lr", "optimizer")
              if getattr(args, k) is not None}
    common = dict(model=args.model, seed=args.seed, backend=args.backend,
                  output=args.output, eager=args.eager, **chosen)
    config: GPTConfig | TrainConfig
    if args.model == GPT_MODEL:
        config = GPTConfig(text=args.text, steps_per_epoch=args.steps_per_epoch,
                           context=args.context, width=args.width, heads=args.heads,
                           layers=args.layers, **common)
    else:
        config = TrainConfig(**common)
    result: GPTResult | TrainResult
    try:
        if isinstance(config, GPTConfig):
            result = train_gpt(config, resume=args.resume, overwrite=args.overwrite,
                               progress=args.progress)
        else:
            result = train(config, resume=args.resume, overwrite=args.overwrite,
                           progress=args.progress)
    # Bad settings, an unusable output folder and bad checkpoints are ValueErrors
    # raised before training; an OSError can still come from a later write (disk full).
    except (ValueError, OSError) as error:
        message = _one_line(error)
        # train()'s own messages already start "train: " or "train --resume: ".
        prefix = "pullback " if message.startswith("train") else "pullback train: "
        if _primary():
            print(prefix + message, file=sys.stderr)
        return 2
    if not _primary():
        return 0
    if isinstance(result, GPTResult):
        print(f"sample:\n{result.sample}")
        print(f"validation loss: {result.validation_loss:.4f}")
    else:
        print(f"test accuracy: {result.test_accuracy:.4f}")
    return 0


def _primary() -> bool:
    """False in every process of a multi-process `pullback train` but rank 0: those
    train quietly (rank 0 prints)."""
    from . import distributed as dist

    return not dist.is_initialized() or dist.rank() == 0


def _add_sample(commands: Commands) -> None:
    sample = commands.add_parser(
        "sample", help="generate text from a `pullback train --model gpt` run",
        description="Load the GPT trained in a run's output folder and print the prompt "
        "followed by the characters it samples, one at a time, from the softmax of its "
        "logits divided by the temperature (0: always the most likely), among the top-k.")
    sample.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="the training run's output folder")
    sample.add_argument("--prompt", default="", help="the text to continue")
    sample.add_argument("--tokens", type=int, default=300,
                        help="characters to generate (default: %(default)s)")
    sample.add_argument("--temperature", type=float, default=1.0,
                        help="(default: %(default)s)")
    sample.add_argument("--top-k", type=int, default=None, metavar="K",
                        help="sample among the K most likely characters only")
    sample.add_argument("--seed", type=int, default=0)
    sample.set_defaults(run=_run_sample, command_parser=sample)


def _run_sample(args: argparse.Namespace, injected: _Injected) -> int:
    from .gpt import sample

    try:
        text = sample(args.checkpoint, args.prompt, args.tokens,
                      temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    except (ValueError, OSError) as error:  # CheckpointError is a ValueError
        print(f"pullback sample: {_one_line(error)}", file=sys.stderr)
        return 2
    print(text)
    return 0


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _add_check(commands: Commands) -> None:
    check = commands.add_parser(
        "check", help="check every primitive's derivatives numerically",
        description="Check every primitive's gradients (fused kernels and rules) against "
        "central differences, its second derivative, and jvp against vjp, on each backend "
        "in float32 and float64. Exits non-zero on any failure.")
    check.add_argument("--op", action="append", metavar="NAME", dest="ops",
                       help="check only this primitive (repeatable)")
    check.add_argument("--backend", choices=[*BACKENDS, "all"], default="all",
                       help="which backend to check on (default: all)")
    check.set_defaults(run=_run_check, command_parser=check)


def _run_check(args: argparse.Namespace, injected: _Injected) -> int:
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    start = time.perf_counter()
    try:
        rows = run_checks(args.ops, backends, **injected)
    except KeyError as err:
        args.command_parser.error(str(err.args[0]))
    print(format_table(rows))
    print(summary(rows, time.perf_counter() - start))
    sys.stdout.flush()
    return 0 if all(r.passed for r in rows) else 1


def _add_run(commands: Commands) -> None:
    run = commands.add_parser(
        "run", help="run an ONNX model on .npy inputs",
        description="Load an ONNX model, run it on inputs saved with numpy.save (one --input "
        "per graph input, in the graph's order), print each output's shape and dtype and the "
        "time taken, and optionally save the outputs.")
    run.add_argument("model", help="the .onnx file")
    run.add_argument("--input", action="append", default=[], metavar="X.npy", dest="inputs",
                     help="an input array (repeat for each graph input, in order)")
    run.add_argument("--output", action="append", default=[], metavar="Y.npy", dest="outputs",
                     help="where to save an output, in NumPy's .npy format under exactly "
                     "this name (repeat for later outputs, in order)")
    run.add_argument("--repeat", type=int, default=3, metavar="N",
                     help="timed calls after the first, which builds the plan (default: 3)")
    run.set_defaults(run=_run_run, command_parser=run)


def _run_run(args: argparse.Namespace, injected: _Injected) -> int:
    import numpy as np

    try:
        for path in args.outputs:
            _check_output_file(path)
        import pullback.onnx as ponnx

        start = time.perf_counter()
        model = ponnx.load(args.model)
        loaded = time.perf_counter() - start
        if len(args.inputs) != len(model.input_names):
            names = ", ".join(model.input_names)
            args.command_parser.error(f"the model takes {len(model.input_names)} inputs "
                                      f"({names}); give one --input per input, in order")
        if len(args.outputs) > len(model.output_names):
            args.command_parser.error(f"the model has {len(model.output_names)} outputs, but "
                                      f"{len(args.outputs)} --output paths were given")
        inputs = [np.load(path, allow_pickle=False) for path in args.inputs]
        start = time.perf_counter()
        outputs = model(*inputs)
        first = time.perf_counter() - start
        times = []
        for _ in range(max(args.repeat, 0)):
            start = time.perf_counter()
            model(*inputs)
            times.append(time.perf_counter() - start)
    except (ImportError, OSError, ValueError) as error:  # OnnxImportError is a ValueError
        print(f"pullback run: {_one_line(error)}", file=sys.stderr)
        return 2
    print(f"model: {args.model} (opset {model.opsets.get('', '?')}, {len(model.spec.nodes)} "
          f"nodes), mode: {model.mode(*inputs)}")
    for name, x in zip(model.input_names, inputs):
        print(f"input {name}: {x.shape} {x.dtype}")
    for name, y in zip(model.output_names, outputs):
        array = np.asarray(y) if not isinstance(y, list) else None
        described = f"{array.shape} {array.dtype}" if array is not None else \
            f"sequence of {len(y)}"
        print(f"output {name}: {described}")
    steady = f", then {1e3 * sorted(times)[len(times) // 2]:.1f} ms per call (median of " \
             f"{len(times)})" if times else ""
    print(f"load {1e3 * loaded:.1f} ms, first call {1e3 * first:.1f} ms{steady}")
    for path, y in zip(args.outputs, outputs):
        try:
            _save_npy(path, np.asarray(y))
        except (OSError, ValueError) as error:
            print(f"pullback run: cannot save {path}: {_one_line(error)}", file=sys.stderr)
            return 2
        print(f"saved {path}")
    return 0


def _check_output_file(path: str) -> None:
    """ValueError (one line) unless a file can be written at exactly `path`; asked
    before the model runs, so a typo does not cost a run."""
    import os

    from .io.atomic import check_writable

    if not path:
        raise ValueError("--output is empty; name the .npy file to write")
    if os.path.isdir(path):
        raise ValueError(f"--output {path} is a folder; name the file to write")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        what = "is a file" if os.path.exists(folder) else "does not exist"
        raise ValueError(f"--output {path}: {folder} {what}")
    try:
        check_writable(folder)
    except OSError as error:
        raise ValueError(f"--output {path}: cannot write to {folder}: "
                         f"{error.strerror or error}") from None


def _save_npy(path: str, array: np.ndarray) -> None:
    """`array` in .npy format at exactly `path`, atomically. (`np.save(path)` would
    append ".npy" to a name without it, so the file written would not be the one named.)"""
    import io

    import numpy as np

    from .io.atomic import atomic_write

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    atomic_write(path, buffer.getbuffer())


if __name__ == "__main__":
    sys.exit(main())
