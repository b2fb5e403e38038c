"""The tracker's tables, as sqlmodel models (the one place the schema is written down).

The DDL is compiled from these models when a database is created or migrated; the hot paths
(the writer, the readers) then use plain `sqlite3` so that opening an existing database never pays
for importing SQLAlchemy. Times are UNIX seconds (REAL). A metric `value` of NULL means NaN
(SQLite turns a bound NaN into NULL); +/-inf are stored as IEEE infinities and read back as such.

Schema history (`SCHEMA_VERSION`, `MIGRATIONS` in `engine.tracking.db`):
- 1: runs, metrics, events, eval_results, schema_version.
- 2: index metrics(run_id, name, value) (median tokens/s without sorting every row); the
  (run_id, name, step) index became (run_id, name, rank, step, value): a rank's curve is read from
  the index alone.
- 3: runs.nnodes, runs.rdzv_endpoint (multi-node torchrun launches), runs.slurm_job_id (a run submitted
  with `tunebench run --slurm`).
- 4: runs.queue_pos (the place of a run waiting in the run queue; NULL when it is not waiting) and the
  one-row table queue_state (queue paused or not; the pid of the scheduler process that drives it).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

SCHEMA_VERSION = 4

from engine.tracking.records import RUN_KINDS, RUN_STATUSES  # noqa: E402  (re-exported)

__all__ = ["RUN_KINDS", "RUN_STATUSES", "Run", "Metric", "Event", "EvalResult", "QueueState", "SchemaVersion"]


class Run(SQLModel, table=True):
    """One training run: what was asked, where it runs, how it ended."""

    __tablename__ = "runs"
    __table_args__ = (sa.Index("ix_runs_status", "status"),)

    id: str = Field(primary_key=True)  # e.g. "261129-3fa2": date + random hex, also the folder name
    name: str = Field(sa_column_kwargs={"unique": True, "nullable": False})
    recipe: str  # "sft", "dpo", ... (engine.recipes.<recipe>)
    module: str  # the python module torchrun starts (-m); engine.recipes.<recipe> unless overridden
    status: str = "queued"  # one of RUN_STATUSES
    kind: str = "new"  # one of RUN_KINDS
    config_text: str  # the YAML the run was started with (runs/<id>/config.yaml)
    model: str | None = None  # a human label of the model (checkpoint dir or builder)
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    error: str | None = None  # tail of stdout.log when the run failed; "process lost" when it vanished
    parent_id: str | None = Field(default=None, foreign_key="runs.id")  # the run this one was cloned from
    pid: int | None = None  # torchrun
    pgid: int | None = None  # process group of torchrun and its workers (the target of `stop`)
    supervisor_pid: int | None = None  # the detached process that waits for torchrun
    supervisor_started: float | None = None  # its start time (guards against pid reuse)
    nproc: int = 1
    host: str
    output_dir: str
    tags: str = ""  # comma separated
    notes: str = ""
    step: int = 0  # last optimizer step reported by rank 0
    total_steps: int | None = None
    stop_requested: bool = False
    resumes: int = 0  # how many times this run was resumed
    nnodes: int = Field(
        default=1, sa_column_kwargs={"server_default": "1"}
    )  # nodes of a multi-node run (nproc is per node); this host runs node rank 0
    rdzv_endpoint: str | None = None  # HOST:PORT of a multi-node rendezvous (None: one node, standalone)
    slurm_job_id: str | None = None  # the SLURM job of a run submitted with --slurm (squeue/sacct name it)
    queue_pos: int | None = None  # 1, 2, ...: its place while it waits in the run queue (NULL: not waiting)


class Metric(SQLModel, table=True):
    """One scalar at one step from one rank (long format). `id` grows in commit order: readers poll
    `id > last_id` (never misses a late rank) or `step > last_step`."""

    __tablename__ = "metrics"
    __table_args__ = (
        sa.Index("ix_metrics_run_id", "run_id", "id"),
        sa.Index("ix_metrics_run_step", "run_id", "step"),
        sa.Index("ix_metrics_run_name_rank_step", "run_id", "name", "rank", "step", "value"),
        sa.Index("ix_metrics_run_name_value", "run_id", "name", "value"),
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="runs.id")
    step: int
    name: str
    value: float | None = None  # NULL = NaN
    time: float
    rank: int = 0


class Event(SQLModel, table=True):
    """Something a person should notice: checkpoint, nan, oom, eval, resume, end, ..."""

    __tablename__ = "events"
    __table_args__ = (sa.Index("ix_events_run_id", "run_id", "id"), {"sqlite_autoincrement": True})

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="runs.id")
    step: int
    kind: str
    text: str
    time: float
    rank: int = 0


class EvalResult(SQLModel, table=True):
    """One evaluation score (task, metric) of a run at a step, optionally of a given checkpoint."""

    __tablename__ = "eval_results"
    __table_args__ = (sa.Index("ix_eval_results_run", "run_id", "step"), {"sqlite_autoincrement": True})

    id: int | None = Field(default=None, primary_key=True)
    run_id: str = Field(foreign_key="runs.id")
    step: int
    task: str
    metric: str
    value: float | None = None  # NULL = NaN
    checkpoint: str | None = None
    time: float


class QueueState(SQLModel, table=True):
    """The run queue's one row (id 1): paused or not, and the scheduler process driving it (pid and start
    time, so a reused pid is not mistaken for it; NULL when no scheduler runs)."""

    __tablename__ = "queue_state"

    id: int = Field(default=1, primary_key=True)
    paused: bool = Field(default=False, sa_column_kwargs={"server_default": "0"})
    scheduler_pid: int | None = None
    scheduler_started: float | None = None


class SchemaVersion(SQLModel, table=True):
    """A single row: the schema version this database is at."""

    __tablename__ = "schema_version"

    version: int = Field(primary_key=True)


TABLES = ("runs", "metrics", "events", "eval_results", "queue_state", "schema_version")


def table_statement(name: str) -> str:
    """The CREATE TABLE statement of one table of the current schema (migrations that add a table)."""
    from sqlalchemy.dialects import sqlite
    from sqlalchemy.schema import CreateTable

    return str(CreateTable(SQLModel.metadata.tables[name]).compile(dialect=sqlite.dialect())).strip()


def create_statements() -> list[str]:
    """The SQLite DDL (tables, then indexes) for the current schema."""
    from sqlalchemy.dialects import sqlite
    from sqlalchemy.schema import CreateIndex, CreateTable

    dialect = sqlite.dialect()
    out: list[str] = []
    tables = SQLModel.metadata.sorted_tables
    mine = [t for t in tables if t.name in set(TABLES)]
    for table in mine:
        out.append(str(CreateTable(table).compile(dialect=dialect)).strip())
    for table in mine:
        for index in sorted(table.indexes, key=lambda i: i.name):
            out.append(str(CreateIndex(index).compile(dialect=dialect)).strip())
    return out
