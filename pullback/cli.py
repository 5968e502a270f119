"""The `pullback` command: `pullback train` trains the default model on the bundled
digits; `pullback check` checks every primitive's derivatives.

Each subcommand is an `_add_<name>` function that declares its arguments and
the function that runs it; `main` dispatches.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .check.runner import BACKENDS, format_table, run_checks, summary


def main(
    argv: Sequence[str] | None = None,
    *,
    primitives: Mapping[str, Any] | None = None,
    specs: Mapping[str, Any] | None = None,
) -> int:
    """Run the command line; returns the exit status. `primitives` and `specs` replace
    the registry and the sample table for `check` (for testing the command itself)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.run(args, {"primitives": primitives, "specs": specs})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pullback", description="pullback: a deep-learning engine built around the "
        "backward pass.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_train(commands)
    _add_check(commands)
    return parser


def _add_train(commands: Any) -> None:
    from .training import BACKENDS as TRAIN_BACKENDS
    from .training import MODELS, OPTIMIZERS, TrainConfig

    defaults = TrainConfig()
    train = commands.add_parser(
        "train", help="train the default model on the bundled digits data",
        description="Train a small CNN (or an MLP) on the 8x8 digits shipped with pullback, "
        "evaluate it on the held-out split each epoch, and write a resumable checkpoint, the "
        "final weights and (with matplotlib) a plot of loss and accuracy to the output folder. "
        "The last line printed is the test accuracy.")
    train.add_argument("--model", choices=MODELS, default=defaults.model)
    train.add_argument("--epochs", type=int, default=defaults.epochs)
    train.add_argument("--batch-size", type=int, default=defaults.batch_size)
    train.add_argument("--lr", type=float, default=defaults.lr,
                       help="peak learning rate, decayed along a cosine (default: %(default)s)")
    train.add_argument("--optimizer", choices=OPTIMIZERS, default=defaults.optimizer)
    train.add_argument("--seed", type=int, default=defaults.seed)
    train.add_argument("--backend", choices=tuple(TRAIN_BACKENDS), default=defaults.backend)
    train.add_argument("--output", default=defaults.output, metavar="DIR",
                       help="folder for the checkpoint, weights and plot (default: %(default)s)")
    train.add_argument("--eager", action="store_true",
                       help="run eager autograd instead of a compiled training plan")
    train.add_argument("--resume", action="store_true",
                       help="continue from the checkpoint in the output folder")
    train.add_argument("--no-progress", dest="progress", action="store_false",
                       help="no progress bar")
    train.set_defaults(run=_run_train, command_parser=train)


def _run_train(args: argparse.Namespace, injected: dict[str, Any]) -> int:
    from .training import TrainConfig, train

    config = TrainConfig(model=args.model, epochs=args.epochs, batch_size=args.batch_size,
                         lr=args.lr, optimizer=args.optimizer, seed=args.seed,
                         backend=args.backend, output=args.output, eager=args.eager)
    try:
        result = train(config, resume=args.resume, progress=args.progress)
    except (ValueError, FileNotFoundError) as error:
        print(f"pullback train: {error}", file=sys.stderr)
        return 2
    print(f"test accuracy: {result.test_accuracy:.4f}")
    return 0


def _add_check(commands: Any) -> None:
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


def _run_check(args: argparse.Namespace, injected: dict[str, Any]) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
