"""`tunebench resume RUN [--detach] [--trust-checkpoint]`: restart a run from its newest checkpoint.

A checkpoint folder this run did not write (no valid mark of this home: copied in, downloaded) is
refused, since resuming unpickles its metadata; `--trust-checkpoint` resumes it anyway.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("resume", help="restart a stopped/failed run from its newest checkpoint and follow it")
    p.add_argument("run", metavar="RUN", help="run id or name")
    p.add_argument("--detach", action="store_true", help="return once launched")
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="resume a checkpoint this run did not write (its metadata is a pickle: only one you trust)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workbench import launcher
    from workbench.cli_progress import announce_and_follow

    rec = launcher.resume(args.run, trust_checkpoint=args.trust_checkpoint)
    return announce_and_follow(rec, f"resumed from step {rec.step}", detach=args.detach)
