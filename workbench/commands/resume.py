"""`tunebench resume RUN [--detach]`: restart a run from its newest checkpoint."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("resume", help="restart a stopped/failed run from its newest checkpoint and follow it")
    p.add_argument("run", metavar="RUN", help="run id or name")
    p.add_argument("--detach", action="store_true", help="return once launched")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workbench import launcher
    from workbench.cli_progress import follow

    rec = launcher.resume(args.run)
    print(
        f"run {rec.name} ({rec.id}) resumed from step {rec.step}; log: {rec.output_dir}/stdout.log",
        flush=True,
    )
    if args.detach:
        return 0
    return follow(rec.id, stream=sys.stderr)
