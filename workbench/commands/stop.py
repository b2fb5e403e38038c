"""`tunebench stop RUN [--grace S]`: SIGTERM to the run's process group, SIGKILL after the grace period
(a run waiting in the run queue is cancelled instead)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stop", help="stop a run (it checkpoints and exits; killed after --grace seconds)")
    p.add_argument("run", metavar="RUN", help="run id or name")
    p.add_argument(
        "--grace",
        type=float,
        default=120.0,
        help="seconds to checkpoint and exit before SIGKILL (default 120)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.tracking.db import open_db
    from engine.tracking.readers import get_run
    from engine.tracking.records import ACTIVE_STATUSES
    from workbench import launcher
    from workbench.errors import UserError

    with open_db(create=False) as db:  # an unknown or finished run: its one line, before any "stopping"
        found = get_run(args.run, db=db)
    if found.status not in ACTIVE_STATUSES:
        raise UserError(f"run {found.name} is {found.status}, not running: nothing to stop")
    if found.status == "queued" and found.queue_pos is not None:  # waiting in the run queue: never ran
        rec = launcher.stop(args.run)
        print(
            f"run {rec.name} ({rec.id}): {rec.status}"
            + (" (it was waiting in the queue)" if rec.status == "cancelled" else "")
        )
        return 0
    print(
        f"stopping {args.run}: it saves a checkpoint and exits (killed after {args.grace:g} s) ...",
        flush=True,
    )
    rec = launcher.stop(args.run, grace_s=args.grace)
    print(f"run {rec.name} ({rec.id}): {rec.status}")
    return 0
