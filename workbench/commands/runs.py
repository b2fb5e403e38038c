"""`tunebench runs [--json]`: every run with its summary."""

from __future__ import annotations

import argparse
import json
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list runs (status, step, last loss, tokens/s, peak memory)")
    p.add_argument("--json", action="store_true", help="one JSON array of run summaries")
    p.add_argument(
        "--status",
        choices=["queued", "running", "completed", "failed", "stopped", "cancelled"],
        help="only this status",
    )
    p.add_argument("--limit", type=int, help="newest N runs only")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.tracking.db import open_db
    from engine.tracking.paths import db_path
    from engine.tracking.readers import list_summaries
    from workbench.cli_format import emit, json_safe, table
    from workbench.cli_progress import human_duration, human_number

    if not db_path().exists():
        emit("[]" if args.json else "no runs yet: start one with `tunebench run RECIPE --config FILE`")
        return 0
    with open_db() as db:
        rows = list_summaries(db=db, status=args.status, limit=args.limit)
    if args.json:
        emit(json.dumps([json_safe(s.to_dict()) for s in rows], indent=2))
        return 0
    now = time.time()
    body = [
        [
            s.run.id,
            s.run.name,
            s.run.recipe,
            s.run.status,
            f"{s.run.step}/{s.run.total_steps or '?'}",
            "-" if s.last_loss is None else f"{s.last_loss:.4g}",
            human_number(s.tokens_per_sec_median),
            "-" if s.mem_peak_gb is None else f"{s.mem_peak_gb:.2f}",
            human_duration(now - s.run.created_at) + " ago",
        ]
        for s in rows
    ]
    emit(table(["ID", "NAME", "RECIPE", "STATUS", "STEP", "LOSS", "TOK/S", "PEAK GB", "CREATED"], body))
    return 0
