"""The run queue, kept in the tracker: runs waiting for the device, in order, and the queue's state.

A run waits in the queue while its row is `queued` with a `queue_pos` (1, 2, ...: lower starts first).
The scheduler (`workbench.scheduler`, a detached process) takes the first waiting run when the device is
free: `take_next` clears its `queue_pos` in the same transaction that picks it, so a `cancel` that comes
later finds it gone from the queue (and says so) instead of racing the launch. The one-row table
`queue_state` says whether the queue is paused and which scheduler process drives it (pid + start time;
`claim_scheduler` lets one live scheduler hold it at a time).

Every function takes an open connection keyword `db`; writes run in one `write_tx` each.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from engine.tracking.db import write_tx
from engine.tracking.readers import _RUN_SELECT, _run, get_run
from engine.tracking.records import RunRecord
from engine.tracking.tracker_errors import TrackerError

_WAITING = "status = 'queued' AND queue_pos IS NOT NULL"


@dataclass(frozen=True)
class QueueState:
    """Whether the queue is paused, and the scheduler process recorded as driving it (None: none)."""

    paused: bool
    scheduler_pid: int | None
    scheduler_started: float | None


def _ensure_row(db: sqlite3.Connection) -> None:
    db.execute("INSERT OR IGNORE INTO queue_state (id, paused) VALUES (1, 0)")


def queue_state(*, db: sqlite3.Connection) -> QueueState:
    """The queue's state (not paused, no scheduler, when nothing was ever queued)."""
    row = db.execute(
        "SELECT paused, scheduler_pid, scheduler_started FROM queue_state WHERE id = 1"
    ).fetchone()
    if row is None:
        return QueueState(False, None, None)
    return QueueState(bool(row[0]), row[1], row[2])


def waiting_runs(*, db: sqlite3.Connection) -> list[RunRecord]:
    """The runs waiting in the queue, first to start first."""
    return [_run(r) for r in db.execute(f"{_RUN_SELECT} WHERE {_WAITING} ORDER BY queue_pos, created_at")]


def _renumber(db: sqlite3.Connection, ids: list[str]) -> None:
    for pos, rid in enumerate(ids, start=1):
        db.execute("UPDATE runs SET queue_pos = ? WHERE id = ?", (pos, rid))


def _waiting_ids(db: sqlite3.Connection) -> list[str]:
    return [r for (r,) in db.execute(f"SELECT id FROM runs WHERE {_WAITING} ORDER BY queue_pos, created_at")]


def enqueue(run_ids: Iterable[str], *, db: sqlite3.Connection) -> list[RunRecord]:
    """Put runs at the end of the queue, in the order given, all or none (one transaction).

    A run can wait in the queue when it was registered and never launched (`queued`, no supervisor)
    or was cancelled from the queue (it goes back to `queued`). Raises `TrackerError` naming the first
    run that cannot (running, ended, already waiting). Returns the rows as queued.
    """
    ids = list(dict.fromkeys(run_ids))
    with write_tx(db):
        found = [get_run(rid, db=db) for rid in ids]
        for run in found:
            if run.queue_pos is not None and run.status == "queued":
                raise TrackerError(f"run {run.name} is already in the queue (place {run.queue_pos})")
            startable = (run.status == "queued" and run.supervisor_pid is None) or (
                run.status == "cancelled" and run.started_at is None
            )
            if not startable or run.slurm_job_id is not None:
                raise TrackerError(
                    f"run {run.name} is {run.status}: only a run that never started can wait in the queue "
                    f"(clone it to run it again: tunebench clone {run.name})"
                )
        waiting = _waiting_ids(db)
        for run in found:
            db.execute("UPDATE runs SET status = 'queued', ended_at = NULL WHERE id = ?", (run.id,))
        _renumber(db, waiting + [run.id for run in found])
        return [get_run(run.id, db=db) for run in found]


def cancel(run_id: str, *, db: sqlite3.Connection) -> RunRecord:
    """Take a waiting run out of the queue: status `cancelled`, never started. Raises `TrackerError`
    when the run is not waiting (the scheduler may have just started it: stop it instead)."""
    with write_tx(db):
        run = get_run(run_id, db=db)
        changed = db.execute(
            f"UPDATE runs SET status = 'cancelled', queue_pos = NULL, ended_at = ? WHERE id = ? AND {_WAITING}",
            (time.time(), run.id),
        ).rowcount
        if not changed:
            hint = (
                f"stop it instead: tunebench stop {run.name}" if run.status in ("queued", "running") else ""
            )
            raise TrackerError(
                f"run {run.name} is not waiting in the queue (it is {run.status})"
                + (f": {hint}" if hint else "")
            )
        _renumber(db, _waiting_ids(db))
        return get_run(run.id, db=db)


MOVES = ("up", "down", "top", "bottom")


def move(run_id: str, position: int | str, *, db: sqlite3.Connection) -> int:
    """Move a waiting run to `position` (1 = next to start; clipped to the queue's length) or by one of
    `up`, `down`, `top`, `bottom` (read and moved in one transaction, so two quick moves add up); the
    others keep their order. Returns the place it got. Raises `TrackerError` when the run is not waiting
    or `position` is none of these."""
    with write_tx(db):
        run = get_run(run_id, db=db)
        ids = _waiting_ids(db)
        if run.id not in ids:
            raise TrackerError(f"run {run.name} is not waiting in the queue (it is {run.status})")
        here = ids.index(run.id) + 1
        relative = {"up": here - 1, "down": here + 1, "top": 1, "bottom": len(ids)}
        if isinstance(position, str) and position not in relative:
            try:
                position = int(position)
            except ValueError:
                raise TrackerError(
                    f"move {position!r}: give a place (1 = next) or one of {', '.join(MOVES)}"
                ) from None
            if position < 1:
                raise TrackerError(f"move {position}: places start at 1 (the next run to start)")
        target = relative[position] if isinstance(position, str) else int(position)
        ids.remove(run.id)
        place = min(max(1, target), len(ids) + 1)
        ids.insert(place - 1, run.id)
        _renumber(db, ids)
        return place


def set_paused(paused: bool, *, db: sqlite3.Connection) -> None:
    """Pause (the scheduler starts nothing more) or resume the queue. A running run is not touched."""
    with write_tx(db):
        _ensure_row(db)
        db.execute("UPDATE queue_state SET paused = ? WHERE id = 1", (int(bool(paused)),))


def take_next(*, db: sqlite3.Connection) -> RunRecord | None:
    """The first waiting run, taken out of the queue in the same transaction (its `queue_pos` cleared,
    status still `queued` until the launch records its supervisor); None when the queue is paused or
    empty."""
    with write_tx(db):
        state = queue_state(db=db)
        if state.paused:
            return None
        ids = _waiting_ids(db)
        if not ids:
            return None
        db.execute("UPDATE runs SET queue_pos = NULL WHERE id = ?", (ids[0],))
        _renumber(db, ids[1:])
        return get_run(ids[0], db=db)


def busy_runs(*, db: sqlite3.Connection, host: str) -> list[RunRecord]:
    """Runs using this host's device now: `running`, or launched and starting (`queued` with a
    supervisor), excluding SLURM runs (they run on the cluster's nodes)."""
    rows = db.execute(
        f"{_RUN_SELECT} WHERE host = ? AND slurm_job_id IS NULL AND "
        "(status = 'running' OR (status = 'queued' AND supervisor_pid IS NOT NULL))",
        (host,),
    )
    return [_run(r) for r in rows]


def claim_scheduler(
    pid: int, started: float | None, *, db: sqlite3.Connection, alive: Callable[[int, float | None], bool]
) -> bool:
    """Record `pid` as the queue's scheduler unless another live one (`alive(pid, started)`) holds it;
    True when `pid` holds it now."""
    with write_tx(db):
        _ensure_row(db)
        state = queue_state(db=db)
        if state.scheduler_pid not in (None, pid) and alive(state.scheduler_pid, state.scheduler_started):
            return False
        db.execute(
            "UPDATE queue_state SET scheduler_pid = ?, scheduler_started = ? WHERE id = 1", (pid, started)
        )
        return True


def release_scheduler(pid: int, *, db: sqlite3.Connection, force: bool = False) -> bool:
    """The scheduler `pid` lets go of the queue when it has nothing to start (paused, or no run
    waiting) or with `force`; True when it let go (it should exit). Checked and released in one
    transaction, so a run queued just before is seen and one queued just after finds no scheduler and
    starts a new one."""
    with write_tx(db):
        state = queue_state(db=db)
        if not force and not state.paused and _waiting_ids(db):
            return False
        db.execute(
            "UPDATE queue_state SET scheduler_pid = NULL, scheduler_started = NULL "
            "WHERE id = 1 AND scheduler_pid = ?",
            (pid,),
        )
        return True
