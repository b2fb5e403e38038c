"""Writing run rows: register, update, request a stop, truncate for resume, delete.

Used by the launcher and the workbench; recipes never call these (they use `MetricLogger`).
Every function takes an open connection keyword `db` (from `engine.tracking.db.connect`).
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import sqlite3
import time
from datetime import datetime
from pathlib import Path

from engine.tracking.db import write_tx
from engine.tracking.paths import ensure_private_dir, run_dir, runs_root
from engine.tracking.records import RUN_COLUMNS, RUN_KINDS, RUN_STATUSES, RunRecord
from engine.tracking.tracker_errors import TrackerError

_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_TAG_OK = re.compile(r"^[^,\s]{1,64}$")
_UPDATABLE = set(RUN_COLUMNS) - {"id", "created_at"}


def new_run_id() -> str:
    """`YYMMDD-xxxxxx`: sortable by day, random within it."""
    return f"{datetime.now():%y%m%d}-{secrets.token_hex(3)}"


def create_run(
    *,
    db: sqlite3.Connection,
    recipe: str,
    config_text: str,
    module: str | None = None,
    name: str | None = None,
    nproc: int = 1,
    model: str | None = None,
    parent_id: str | None = None,
    kind: str = "new",
    tags: list[str] | tuple[str, ...] = (),
    notes: str = "",
    total_steps: int | None = None,
    run_id: str | None = None,
    output_dir: str | os.PathLike | None = None,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
) -> RunRecord:
    """Insert a `queued` run and create its private folder `runs/<id>/`; returns the row.

    `name` defaults to `<recipe>-<n>`; a taken name raises `TrackerError`, as does a name with
    characters other than letters, digits, `.`, `_`, `-` (it is used on the command line);
    so does an empty tag or one with a comma or space (tags are stored comma-separated).
    `run_id` (default: a fresh `new_run_id()`) lets a caller write into the folder first.
    `output_dir` replaces `runs/<id>/` as the run's folder (a multi-node run's shared folder; the
    caller creates it); `nnodes` and `rdzv_endpoint` describe a multi-node launch.
    """
    if kind not in RUN_KINDS:
        raise TrackerError(f"run kind {kind!r} is not one of {', '.join(RUN_KINDS)}")
    if nproc < 1:
        raise TrackerError(f"nproc={nproc}: use 1 or more processes")
    if name is not None and not _NAME_OK.match(name):
        raise TrackerError(f"run name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)")
    for tag in tags:  # stored comma-separated: a comma or an empty tag would not come back as given
        if not isinstance(tag, str) or not _TAG_OK.match(tag):
            raise TrackerError(f"tag {tag!r}: give a word without commas or spaces (at most 64 characters)")
    home_runs = ensure_private_dir(runs_root())
    if run_id is None:
        run_id = new_run_id()
        while (home_runs / run_id).exists():
            run_id = new_run_id()
    out = Path(output_dir) if output_dir is not None else ensure_private_dir(run_dir(run_id))
    now = time.time()
    with write_tx(db):
        if name is None:
            n = db.execute("SELECT COUNT(*) FROM runs WHERE recipe = ?", (recipe,)).fetchone()[0] + 1
            name = f"{recipe}-{n}"
            while db.execute("SELECT 1 FROM runs WHERE name = ?", (name,)).fetchone():
                n += 1
                name = f"{recipe}-{n}"
        elif db.execute("SELECT 1 FROM runs WHERE name = ?", (name,)).fetchone():
            raise TrackerError(f"run name {name!r} is taken: choose another name")
        row = dict(
            id=run_id,
            name=name,
            recipe=recipe,
            module=module or f"engine.recipes.{recipe}",
            status="queued",
            kind=kind,
            config_text=config_text,
            model=model,
            created_at=now,
            started_at=None,
            ended_at=None,
            exit_code=None,
            error=None,
            parent_id=parent_id,
            pid=None,
            pgid=None,
            supervisor_pid=None,
            supervisor_started=None,
            nproc=nproc,
            host=socket.gethostname(),
            output_dir=str(out),
            tags=",".join(tags),
            notes=notes,
            step=0,
            total_steps=total_steps,
            stop_requested=False,
            resumes=0,
            nnodes=int(nnodes),
            rdzv_endpoint=rdzv_endpoint,
            slurm_job_id=None,
            queue_pos=None,
        )
        cols = ", ".join(RUN_COLUMNS)
        marks = ", ".join("?" for _ in RUN_COLUMNS)
        db.execute(f"INSERT INTO runs ({cols}) VALUES ({marks})", [row[c] for c in RUN_COLUMNS])
    return RunRecord(**row)


def update_run(run_id: str, *, db: sqlite3.Connection, **fields: object) -> None:
    """Set columns of one run (names as in `RunRecord`); raises `TrackerError` on an unknown column
    or status."""
    bad = set(fields) - _UPDATABLE
    if bad:
        raise TrackerError(f"cannot update run field(s) {', '.join(sorted(bad))}")
    if "status" in fields and fields["status"] not in RUN_STATUSES:
        raise TrackerError(f"run status {fields['status']!r} is not one of {', '.join(RUN_STATUSES)}")
    if not fields:
        return
    sets = ", ".join(f"{k} = ?" for k in fields)
    with write_tx(db):
        db.execute(f"UPDATE runs SET {sets} WHERE id = ?", [*fields.values(), run_id])


def truncate_after(run_id: str, step: int, *, db: sqlite3.Connection) -> int:
    """Delete the run's metrics, events and eval results with `step > step` in one transaction, set
    the run's step to `step`; returns how many metric rows went."""
    with write_tx(db):
        n = db.execute("DELETE FROM metrics WHERE run_id = ? AND step > ?", (run_id, step)).rowcount
        db.execute("DELETE FROM events WHERE run_id = ? AND step > ?", (run_id, step))
        db.execute("DELETE FROM eval_results WHERE run_id = ? AND step > ?", (run_id, step))
        db.execute("UPDATE runs SET step = ? WHERE id = ?", (step, run_id))
    return n


def delete_run(run_id: str, *, db: sqlite3.Connection) -> None:
    """Delete a run's rows (metrics, events, eval results, the run). Its folder is left to the caller."""
    with write_tx(db):
        for table in ("metrics", "events", "eval_results"):
            db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
        db.execute("UPDATE runs SET parent_id = NULL WHERE parent_id = ?", (run_id,))
        db.execute("DELETE FROM runs WHERE id = ?", (run_id,))


def add_event(run_id: str, step: int, kind: str, text: str, *, db: sqlite3.Connection) -> None:
    """Record one event outside a recipe (launcher: start, resume, stop, end)."""
    with write_tx(db):
        db.execute(
            "INSERT INTO events (run_id, step, kind, text, time, rank) VALUES (?, ?, ?, ?, ?, 0)",
            (run_id, step, kind, text, time.time()),
        )
