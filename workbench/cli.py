"""The `tunebench` command line.

`tunebench` with no arguments opens the workbench. Every subcommand lives in its own module under
`workbench/commands/` and exposes `register(subparsers)`; each registers a parser whose `func`
takes the parsed arguments and returns an exit code. Command modules import heavy libraries
(torch, textual, datasets) inside their functions so that `tunebench --help` and the workbench start fast.

Errors that the user can fix (`UserError`, `engine.config.ConfigError`) print one line and exit 2;
among them `engine.tracking.TrackerReadOnly`, which every write of the tracker raises (from
`engine.tracking.db.write_tx`) when the database or its folder is read-only.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from workbench import commands
from workbench.cli_args import OneLineParser
from workbench.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tunebench",
        description="LLM post-training engine with a terminal workbench. Run without arguments to open the workbench.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # name the subcommand whose options these are not (argparse names only `tunebench`)
        _parser_of(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        _reconcile_lost_runs()
        if args.command is None:
            from workbench.app import run_app

            return run_app() or 0
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, so a closed pipe is caught below rather than at interpreter exit
        return code
    except UserError as exc:
        print(f"tunebench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tunebench runs | head`: the reader has what it wanted; no traceback
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit flush must not fail too
        return 0
    except Exception as exc:  # config errors come from the engine, which does not import workbench
        from engine.config import ConfigError

        if isinstance(exc, ConfigError):
            print(f"tunebench: {exc}", file=sys.stderr)
            return 2
        raise


def _parser_of(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The subcommand's own parser (for its usage and --help in error lines); the root one without."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def _reconcile_lost_runs() -> None:
    """Mark runs whose processes vanished (reboot, kill -9) as failed, before any command looks at
    them: one indexed query on the runs table, nothing at all when no tracker database exists."""
    from engine.tracking.paths import db_path

    if db_path().exists():
        from engine.tracking.tracker_errors import TrackerReadOnly
        from workbench.launcher import reconcile_lost
        from workbench.slurm import reconcile_all

        try:
            reconcile_lost()
            lines = reconcile_all()  # SLURM runs: their state from squeue/sacct (a line when unreadable)
        except TrackerReadOnly:  # reading commands still work; a writing one says so in its own line
            return
        for line in lines:
            print(f"tunebench: {line}", file=sys.stderr)


def entry() -> None:  # pragma: no cover - console script shim
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
