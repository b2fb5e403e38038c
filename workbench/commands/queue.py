"""`tunebench queue [ls|add|cancel|move|pause|resume]`: the run queue (runs that start one after another
when this machine's device is free, driven by a detached scheduler; `tunebench run ... --queue` and
`tunebench sweep` put runs in it)."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "queue",
        help="the run queue: list, add, cancel, reorder, pause and resume queued runs",
        description="Runs in the queue start one at a time, in order, when no run uses this machine's "
        "device; a detached scheduler starts them, so the queue goes on after the terminal closes.",
    )
    qs = p.add_subparsers(dest="queue_command", metavar="ACTION")
    ls = qs.add_parser("ls", help="the runs using the device and the runs waiting, in order (default)")
    ls.add_argument(
        "--json", action="store_true", help="one JSON object: paused, scheduler, running, waiting"
    )
    add = qs.add_parser("add", help="queue registered runs (e.g. from `tunebench clone`) or cancelled ones")
    add.add_argument("runs", nargs="+", metavar="RUN")
    cancel = qs.add_parser("cancel", help="take waiting runs out of the queue (status cancelled)")
    cancel.add_argument("runs", nargs="+", metavar="RUN")
    move = qs.add_parser(
        "move",
        help="move a waiting run: up, down, top, bottom or a place (1 = next; past the end: the end)",
    )
    move.add_argument("run", metavar="RUN")
    move.add_argument("where", metavar="WHERE", help="up, down, top, bottom or a place number")
    qs.add_parser("pause", help="hold the queue: nothing more starts (a running run goes on)")
    qs.add_parser("resume", help="let the queue go on")
    p.set_defaults(func=run, queue_command=None, json=False)


def run(args: argparse.Namespace) -> int:
    from workbench import run_queue

    action = args.queue_command or "ls"
    if action == "add":
        for rec in run_queue.queue_runs(args.runs):
            print(f"run {rec.name} ({rec.id}) queued at place {rec.queue_pos}")
        return 0
    if action == "cancel":
        for name in args.runs:
            rec = run_queue.cancel(name)
            print(f"run {rec.name} ({rec.id}) cancelled")
        return 0
    if action == "move":
        print(_move(args.run, args.where))
        return 0
    if action == "pause":
        run_queue.pause()
        print(
            "queue paused: nothing more starts (running runs go on); `tunebench queue resume` lets it go on"
        )
        return 0
    if action == "resume":
        pid = run_queue.resume()
        waiting = len(run_queue.view().waiting)
        print(f"queue resumed: {waiting} run(s) waiting" + (f", scheduler pid {pid}" if pid else ""))
        return 0
    return _ls(args.json)


def _move(run: str, where: str) -> str:
    """Move a waiting run and say where it is. A move past either end stops there (decided: the queue
    is not an error to overshoot; `up` at the top leaves it there) and the line says so."""
    from engine.tracking.db import open_db
    from engine.tracking.readers import get_run
    from workbench import run_queue

    with open_db() as db:
        rid = get_run(run, db=db).id
    before = [r.id for r in run_queue.view().waiting]
    place = run_queue.move(rid, where)
    last = len(before)
    asked = int(where) if where.lstrip("+").isdigit() else None
    if asked is not None and asked > last:
        return f"run {run} is now at place {place}, the end of the queue ({last} waiting; place {asked} is past it)"
    if rid in before and before.index(rid) + 1 == place and where in ("up", "top", "down", "bottom"):
        end = "top" if where in ("up", "top") else "end"
        return f"run {run} stays at place {place}: it is at the {end} of the queue already"
    return f"run {run} is now at place {place}"


def _ls(as_json: bool) -> int:
    from engine.tracking.paths import db_path
    from workbench import run_queue
    from workbench.cli_format import emit, json_safe, table

    if not db_path().exists():
        emit(json.dumps({"paused": False, "scheduler_pid": None, "running": [], "waiting": []}) if as_json
             else "the queue is empty: `tunebench run RECIPE --config FILE --queue` queues a run")  # fmt: skip
        return 0
    v = run_queue.view()
    if as_json:
        brief = lambda r: {"id": r.id, "name": r.name, "recipe": r.recipe, "status": r.status,  # noqa: E731
                           "queue_pos": r.queue_pos, "tags": r.tag_list, "notes": r.notes}  # fmt: skip
        payload = {"paused": v.paused, "scheduler_pid": v.scheduler_pid,
                   "running": [brief(r) for r in v.busy], "waiting": [brief(r) for r in v.waiting]}  # fmt: skip
        emit(json.dumps(json_safe(payload), indent=2))
        return 0
    state = "paused" if v.paused else (f"scheduler pid {v.scheduler_pid}" if v.scheduler_pid else "idle")
    lines = [f"queue: {len(v.waiting)} waiting, {len(v.busy)} using the device ({state})"]
    rows = [["-", r.id, r.name, r.recipe, r.status, r.notes] for r in v.busy]
    rows += [[str(r.queue_pos), r.id, r.name, r.recipe, "waiting", r.notes] for r in v.waiting]
    if rows:
        lines.append(table(["PLACE", "ID", "NAME", "RECIPE", "STATUS", "NOTES"], rows))
    emit("\n".join(lines))
    return 0
