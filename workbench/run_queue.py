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
        return tq.move(run_id, where, db=db)


def pause() -> None:
    """Hold the queue: nothing more starts (a running run goes on); the scheduler exits."""
    with open_db() as db:
        tq.set_paused(True, db=db)


def resume() -> int | None:
    """Let the queue go on; starts the scheduler when runs are waiting. Returns its pid (or None)."""
    with open_db() as db:
        tq.set_paused(False, db=db)
    return ensure_scheduler()


# -- for the workbench (called in worker threads; plain data back) ---------------------------------------
def screen_view() -> dict:
    """The queue for the Runs screen: `{"paused", "scheduler_pid", "places": {run id: place}}`."""
    from engine.tracking.paths import db_path

    if not db_path().exists():
        return {"paused": False, "scheduler_pid": None, "places": {}}
    v = view()
    return {
        "paused": v.paused,
        "scheduler_pid": v.scheduler_pid,
        "places": {r.id: r.queue_pos for r in v.waiting},
    }


def queue_selected(run_ids: list[str]) -> str:
    """Put runs in the queue, in the order given: a run that never started (registered, or cancelled from
    the queue) waits as it is; an ended one is cloned (same config, this run as parent) and the clone
    waits. Returns what was done, in one line."""
    from workbench import launcher

    ids = []
    with open_db() as db:
        runs = [get_run(rid, db=db) for rid in run_ids]
    for run in runs:
        never_started = run.started_at is None and (
            run.status == "cancelled" or (run.status == "queued" and run.supervisor_pid is None)
        )
        ids.append(
            run.id if never_started or run.status in ("queued", "running") else launcher.clone(run.id).id
        )
    rows = queue_runs(ids)  # a running or already waiting run is refused here, with its one line
    return ", ".join(f"{r.name} #{r.queue_pos}" for r in rows) + " queued"


def toggle_paused() -> bool:
    """Pause a running queue or resume a paused one (starting the scheduler); returns paused or not."""
    if view().paused:
        resume()
        return False
    pause()
    return True


def queue_config(
    *, recipe: str, config_text: str, nproc: int = 1, name: str | None = None, parent_id: str | None = None,
    module: str | None = None, tags: Iterable[str] = (),
) -> tuple[str, int]:  # fmt: skip
    """Register a run from YAML text (validated as a launch is) and queue it instead of launching it;
    returns its id and place."""
    from workbench import launcher

    run = launcher.create_run(
        recipe, config_text=config_text, nproc=nproc, name=name, parent_id=parent_id,
        kind="clone" if parent_id else "new", module=module, tags=tags,
    )  # fmt: skip
    (queued,) = queue_runs([run.id])
    return queued.id, int(queued.queue_pos or 0)
