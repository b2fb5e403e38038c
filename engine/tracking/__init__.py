"""The SQLite run tracker.

Recipes use `MetricLogger` only; the CLI and workbench read through `engine.tracking.readers` and
register/update runs through `engine.tracking.run_rows`. See docs/ARCHITECTURE.md "## Tracker".
"""

from engine.tracking.db import connect, open_db, write_tx
from engine.tracking.paths import db_path, run_dir, tunebench_home
from engine.tracking.records import EvalRow, EventRow, MetricRow, RunRecord, RunSummary
from engine.tracking.tracker_errors import RunNotFound, SchemaError, TrackerError
from engine.tracking.writer import MetricLogger

__all__ = [
    "EvalRow",
    "EventRow",
    "MetricLogger",
    "MetricRow",
    "RunNotFound",
    "RunRecord",
    "RunSummary",
    "SchemaError",
    "TrackerError",
    "connect",
    "db_path",
    "open_db",
    "run_dir",
    "truncate_metrics_after",
    "tunebench_home",
    "write_tx",
]


def truncate_metrics_after(run_id: str, step: int) -> int:
    """Delete a run's metrics/events/eval results past `step`, atomically (for resume)."""
    from engine.tracking.run_rows import truncate_after

    with open_db() as db:
        return truncate_after(run_id, step, db=db)
