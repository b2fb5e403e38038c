"""Reading the tracker: what the CLI and the workbench show.

All functions are keyword-only past the run, take an open connection `db` (from
`engine.tracking.db.connect`; use `open_db()` for one-off reads), never write, and return the plain
records of `engine.tracking.records`. Incremental polling: keep the last `MetricRow.id` /
`EventRow.id` you saw and pass it as `after_id` (ids grow in commit order, so a late rank's row for
an old step is never missed); `after_step` serves "steps newer than the chart shows".
"""

from __future__ import annotations

import sqlite3
import time

from engine.tracking.db import from_db_float
from engine.tracking.records import (
    ACTIVE_STATUSES,
    RUN_COLUMNS,
    EvalRow,
    EventRow,
    MetricRow,
    RunRecord,
    RunSummary,
)
from engine.tracking.tracker_errors import RunNotFound

_RUN_SELECT = f"SELECT {', '.join(RUN_COLUMNS)} FROM runs"


def _run(row: tuple) -> RunRecord:
    d = dict(zip(RUN_COLUMNS, row))
    d["stop_requested"] = bool(d["stop_requested"])
    return RunRecord(**d)


def list_runs(
    *, db: sqlite3.Connection, status: str | None = None, limit: int | None = None
) -> list[RunRecord]:
    """Runs, newest first; `status` filters one status."""
    sql, args = _RUN_SELECT, []
    if status is not None:
        sql += " WHERE status = ?"
        args.append(status)
    sql += " ORDER BY created_at DESC"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(int(limit))
    return [_run(r) for r in db.execute(sql, args)]


def active_runs(*, db: sqlite3.Connection) -> list[RunRecord]:
    """Runs `queued` or `running` (one indexed query; used by lost-process reconciliation)."""
    marks = ", ".join("?" for _ in ACTIVE_STATUSES)
    return [_run(r) for r in db.execute(f"{_RUN_SELECT} WHERE status IN ({marks})", ACTIVE_STATUSES)]


def get_run(run: str, *, db: sqlite3.Connection) -> RunRecord:
    """A run by id, name, or unique id prefix; raises `RunNotFound` naming what was looked for."""
    row = db.execute(f"{_RUN_SELECT} WHERE id = ?", (run,)).fetchone()
    if row is None:
        row = db.execute(f"{_RUN_SELECT} WHERE name = ?", (run,)).fetchone()
    if row is None and run:
        rows = db.execute(
            f"{_RUN_SELECT} WHERE id LIKE ? ESCAPE '\\' LIMIT 2", (_like_prefix(run),)
        ).fetchall()
        if len(rows) == 1:
            row = rows[0]
    if row is None:
        raise RunNotFound(f"no run with id or name {run!r}: `tunebench runs` lists them")
    return _run(row)


def _like_prefix(s: str) -> str:
    return s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def summarize(run: RunRecord, *, db: sqlite3.Connection) -> RunSummary:
    """The summary figures of one run (see `RunSummary`)."""
    rid = run.id
    row = db.execute(
        "SELECT value FROM metrics WHERE run_id = ? AND name = 'loss' AND rank = 0 ORDER BY step DESC, id DESC LIMIT 1",
        (rid,),
    ).fetchone()
    last_loss = None if row is None else from_db_float(row[0])
    n = db.execute(
        "SELECT COUNT(*) FROM metrics WHERE run_id = ? AND name = 'tokens_per_sec' AND value IS NOT NULL",
        (rid,),
    ).fetchone()[0]
    tps = None
    if n:
        mid = db.execute(
            "SELECT value FROM metrics WHERE run_id = ? AND name = 'tokens_per_sec' AND value IS NOT NULL "
            "ORDER BY value LIMIT ? OFFSET ?",
            (rid, 2 - n % 2, (n - 1) // 2),
        ).fetchall()
        tps = sum(v for (v,) in mid) / len(mid)
    row = db.execute(
        "SELECT MAX(value) FROM metrics WHERE run_id = ? AND name = 'mem_peak_gb'", (rid,)
    ).fetchone()
    mem = None if row is None or row[0] is None else float(row[0])
    return RunSummary(
        run=run, last_loss=last_loss, tokens_per_sec_median=tps, mem_peak_gb=mem, eta_s=_eta(run, db)
    )


def _eta(run: RunRecord, db: sqlite3.Connection) -> float | None:
    """Seconds left, from the step rate over the last 20 logged steps of this launch."""
    if run.status != "running" or not run.total_steps or run.step >= run.total_steps:
        return None
    # rank 0's loss rows, newest first, through the (run_id, name, step) index; only this launch's
    rows = db.execute(
        "SELECT step, time FROM metrics WHERE run_id = ? AND name = 'loss' AND rank = 0 ORDER BY step DESC LIMIT 20",
        (run.id,),
    ).fetchall()
    rows = [(s, t) for s, t in rows if t >= (run.started_at or 0.0)]
    if len(rows) < 2:
        return None
    (s1, t1), (s0, t0) = rows[0], rows[-1]
    if s1 <= s0 or t1 <= t0:
        return None
    per_step = (t1 - t0) / (s1 - s0)
    since_last = max(0.0, time.time() - t1)
    return max(0.0, (run.total_steps - s1) * per_step - since_last)


def list_summaries(
    *, db: sqlite3.Connection, status: str | None = None, limit: int | None = None
) -> list[RunSummary]:
    """`list_runs` with each run's summary."""
    return [summarize(r, db=db) for r in list_runs(db=db, status=status, limit=limit)]


def metrics_since(
    run_id: str,
    *,
    db: sqlite3.Connection,
    after_id: int = 0,
    after_step: int | None = None,
    names: list[str] | tuple[str, ...] | None = None,
    limit: int | None = None,
) -> list[MetricRow]:
    """Metric rows of a run with `id > after_id` (and `step > after_step` when given), in id order."""
    if after_step is None:  # walks the (run_id, id) index
        sql = "SELECT id, step, name, value, time, rank FROM metrics WHERE run_id = ? AND id > ?"
        args: list[object] = [run_id, after_id]
    else:  # walks the (run_id, step) index; `+id` keeps the planner off the id index
        sql = (
            "SELECT id, step, name, value, time, rank FROM metrics WHERE run_id = ? AND step > ? AND +id > ?"
        )
        args = [run_id, after_step, after_id]
    if names:
        sql += f" AND name IN ({', '.join('?' for _ in names)})"
        args.extend(names)
    sql += " ORDER BY id"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(int(limit))
    return [MetricRow(i, s, n, from_db_float(v), t, r) for i, s, n, v, t, r in db.execute(sql, args)]


def metric_names(run_id: str, *, db: sqlite3.Connection) -> list[str]:
    """The distinct metric names a run logged, sorted."""
    return [
        n
        for (n,) in db.execute("SELECT DISTINCT name FROM metrics WHERE run_id = ? ORDER BY name", (run_id,))
    ]


# Per-process figures that every rank logs under its own rank (engine.training.meters.memory_stats:
# mem_peak_gb, mem_reserved_gb, rss_gb).
PER_RANK_PREFIXES = ("mem_", "rss_")


def is_per_rank(name: str, ranks: list[int]) -> bool:
    """Whether metric `name` (logged by `ranks`) is a per-rank figure: a per-process meter, or any
    metric a rank other than 0 logged. `show --json` gives every such metric the per-rank shape."""
    return name.startswith(PER_RANK_PREFIXES) or ranks != [0]


def metric_ranks(run_id: str, name: str, *, db: sqlite3.Connection) -> list[int]:
    """The ranks that logged metric `name`, ascending."""
    return [
        r
        for (r,) in db.execute(
            "SELECT DISTINCT rank FROM metrics WHERE run_id = ? AND name = ? ORDER BY rank", (run_id, name)
        )
    ]


def metric_series(
    run_id: str, name: str, *, db: sqlite3.Connection, rank: int | None = 0, max_points: int | None = None
) -> list[tuple[int, float]]:
    """`(step, value)` of one metric in step order (`rank=None`: every rank). With `max_points`,
    evenly thinned to at most that many points (the last point always kept)."""
    where = "run_id = ? AND name = ?" + ("" if rank is None else " AND rank = ?")
    args: list[object] = [run_id, name] + ([] if rank is None else [rank])
    stride = 1
    if max_points is not None and max_points > 1:
        n, first, last = db.execute(
            f"SELECT COUNT(*), MIN(step), MAX(step) FROM metrics WHERE {where}", args
        ).fetchone()
        stride = max(1, n // max_points)
    if stride > 1:  # thin in SQL first (every stride-th step, the first and the last), then exactly below
        sql = f"SELECT step, value FROM metrics WHERE {where} AND (step % ? = 0 OR step IN (?, ?)) ORDER BY step"
        rows = db.execute(sql, [*args, stride, first, last])
    else:
        rows = db.execute(f"SELECT step, value FROM metrics WHERE {where} ORDER BY step", args)
    pts = [(s, from_db_float(v)) for s, v in rows]
    if max_points is not None and len(pts) > max_points > 1:
        step_ = (len(pts) - 1) / (max_points - 1)
        pts = [pts[round(i * step_)] for i in range(max_points)]
    return pts


def events_since(run_id: str, *, db: sqlite3.Connection, after_id: int = 0) -> list[EventRow]:
    """Events of a run with `id > after_id`, oldest first."""
    rows = db.execute(
        "SELECT id, step, kind, text, time, rank FROM events WHERE run_id = ? AND id > ? ORDER BY id",
        (run_id, after_id),
    )
    return [EventRow(*r) for r in rows]


def eval_results(run_id: str, *, db: sqlite3.Connection) -> list[EvalRow]:
    """Every evaluation score of a run, by step then id."""
    rows = db.execute(
        "SELECT id, step, task, metric, value, checkpoint, time FROM eval_results WHERE run_id = ? ORDER BY step, id",
        (run_id,),
    )
    return [EvalRow(i, s, t, m, from_db_float(v), c, tm) for i, s, t, m, v, c, tm in rows]


def config_text(run_id: str, *, db: sqlite3.Connection) -> str:
    """The YAML a run was started with."""
    row = db.execute("SELECT config_text FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise RunNotFound(f"no run with id {run_id!r}: `tunebench runs` lists them")
    return row[0]


def lineage(run_id: str, *, db: sqlite3.Connection) -> list[RunRecord]:
    """The chain of runs this one was cloned from, oldest ancestor first, ending with the run itself."""
    chain: list[RunRecord] = []
    seen: set[str] = set()
    current: str | None = run_id
    while current is not None and current not in seen:
        seen.add(current)
        row = db.execute(f"{_RUN_SELECT} WHERE id = ?", (current,)).fetchone()
        if row is None:
            break
        rec = _run(row)
        chain.append(rec)
        current = rec.parent_id
    return chain[::-1]


def children(run_id: str, *, db: sqlite3.Connection) -> list[RunRecord]:
    """Runs cloned from this one, oldest first."""
    return [_run(r) for r in db.execute(f"{_RUN_SELECT} WHERE parent_id = ? ORDER BY created_at", (run_id,))]
