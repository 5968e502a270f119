"""The `pullback` command: `pullback check` checks every primitive's derivatives.

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
    _add_check(commands)
    # `pullback train` goes here (an `_add_train`) once the training layers exist.
    return parser


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
