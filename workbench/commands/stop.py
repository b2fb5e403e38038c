"""`tunebench stop RUN [--grace S]`: SIGTERM to the run's process group, SIGKILL after the grace period."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stop", help="stop a run (it checkpoints and exits; killed after --grace seconds)")
    p.add_argument("run", metavar="RUN", help="run id or name")
    p.add_argument("--grace", type=float, default=30.0, help="seconds before SIGKILL (default 30)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workbench import launcher

    rec = launcher.stop(args.run, grace_s=args.grace)
    print(f"run {rec.name} ({rec.id}): {rec.status}")
    return 0
