"""`tunebench clone RUN [key=value ...]`: a new run with the same config plus overrides, then launch."""

from __future__ import annotations

import argparse

from workbench.cli_args import add_rest, parse_mixed


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("clone", help="start a new run from a run's config with overrides (parent recorded)")
    p.add_argument("run", metavar="RUN", help="run id or name to copy")
    add_rest(p)
    _options(p)
    p.set_defaults(func=run)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", help="a name for the new run")
    p.add_argument("--nproc", type=int, help="processes (default: as the original)")
    p.add_argument("--detach", action="store_true", help="return once launched")


def run(args: argparse.Namespace) -> int:
    from engine.tracking.db import require_writable
    from workbench import launcher
    from workbench.cli_progress import announce_and_follow

    args = parse_mixed(args, _options, prog="tunebench clone")
    require_writable()  # a read-only tracker is its one line before the new run's folder is made
    rec = launcher.clone(args.run, args.overrides, name=args.name, nproc=args.nproc)
    return announce_and_follow(
        launcher.launch(rec.id), f"cloned from {args.run} and launched", detach=args.detach
    )
