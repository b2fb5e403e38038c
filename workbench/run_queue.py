"""Queue actions the CLI and the workbench call: queue runs, cancel, reorder, pause and resume, and
start the scheduler (`workbench.scheduler`) when there is something for it to start.

The queue itself lives in the tracker (`engine.tracking.queue_rows`); these functions open their own
connections and raise `UserError` / `TrackerError` with one line.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from engine.tracking import queue_rows as tq
from engine.tracking.db import open_db
from engine.tracking.paths import ensure_private_dir, tunebench_home
from engine.tracking.readers import get_run
from engine.tracking.records import RunRecord
from workbench.errors import UserError

MOVES = ("up", "down", "top", "bottom")


@dataclass(frozen=True)
class QueueView:
    """What `tunebench queue ls` and the Runs screen show: paused or not, the live scheduler's pid
    (None: none runs), the runs using the device now and the runs waiting, first to start first."""

    paused: bool
    scheduler_pid: int | None
    busy: list[RunRecord]
    waiting: list[RunRecord]


def view() -> QueueView:
    from workbench.launcher import _alive

    with open_db() as db:
        state = tq.queue_state(db=db)
        busy = tq.busy_runs(db=db, host=socket.gethostname())
        waiting = tq.waiting_runs(db=db)
    pid = state.scheduler_pid
    live = pid is not None and _alive(pid, state.scheduler_started)
    return QueueView(state.paused, pid if live else None, busy, waiting)


def ensure_scheduler() -> int | None:
    """Start the scheduler unless one is alive or it would have nothing to start (queue empty or
    paused); returns the live scheduler's pid, or None. Raises `UserError` when it cannot start."""
    from workbench.launcher import _alive

    with open_db() as db:
        state = tq.queue_state(db=db)
        if state.paused or not tq.waiting_runs(db=db):
            return None
        if state.scheduler_pid is not None and _alive(state.scheduler_pid, state.scheduler_started):
            return state.scheduler_pid
    home = ensure_private_dir(tunebench_home())
    log = home / "scheduler.log"
    env = dict(os.environ, TUNEBENCH_HOME=str(home))
    with open(log, "ab") as err:
        proc = subprocess.run(
            [sys.executable, "-m", "workbench.scheduler", "--fork"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env, timeout=120, check=False,
        )  # fmt: skip
    try:
        return int(proc.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"the queue's scheduler did not start ({tail[0]}); see {log}") from None


def queue_runs(run_ids: Iterable[str]) -> list[RunRecord]:
    """Put registered (never launched) or cancelled runs at the end of the queue and make sure the
    scheduler runs; returns the rows with their places."""
    with open_db() as db:
        rows = tq.enqueue(run_ids, db=db)
    ensure_scheduler()
    return rows


def cancel(run_id: str) -> RunRecord:
    """Take a waiting run out of the queue (status `cancelled`)."""
    with open_db() as db:
        return tq.cancel(run_id, db=db)


def move(run_id: str, where: str | int) -> int:
    """Move a waiting run: `up`, `down`, `top`, `bottom` or a place (1 = next); returns its new place."""
    with open_db() as db:
        run = get_run(run_id, db=db)
        waiting = tq.waiting_runs(db=db)
        if run.queue_pos is None or run.status != "queued":
            raise UserError(f"run {run.name} is not waiting in the queue (it is {run.status})")
        here = [r.id for r in waiting].index(run.id) + 1
        if isinstance(where, str) and where not in MOVES:
            try:
                where = int(where)
            except ValueError:
                raise UserError(
                    f"move {where!r}: give a place (1 = next) or one of {', '.join(MOVES)}"
                ) from None
        target = {"up": here - 1, "down": here + 1, "top": 1, "bottom": len(waiting)}.get(where, where)  # type: ignore[arg-type]
        if int(target) < 1:
            raise UserError(f"move {where}: places start at 1 (the next run to start)")
        return tq.move(run.id, int(target), db=db)


def pause() -> None:
    """Hold the queue: nothing more starts (a running run goes on); the scheduler exits."""
    with open_db() as db:
        tq.set_paused(True, db=db)


def resume() -> int | None:
    """Let the queue go on; starts the scheduler when runs are waiting. Returns its pid (or None)."""
    with open_db() as db:
        tq.set_paused(False, db=db)
    return ensure_scheduler()
