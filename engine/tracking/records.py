"""Plain, immutable rows the readers return (no database handle attached)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

RUN_STATUSES = ("queued", "running", "completed", "failed", "stopped", "cancelled")
RUN_KINDS = ("new", "clone", "resume")
ACTIVE_STATUSES = ("queued", "running")
# `eval_results.checkpoint` of a run's base-model scores (`tunebench eval RUN --base`, stored at step 0):
# what the run started from, shown beside the run's own scores.
BASE_CHECKPOINT = "base"


@dataclass(frozen=True)
class RunRecord:
    """A row of `runs` (see `engine.tracking.tables.Run` for the meaning of each field)."""

    id: str
    name: str
    recipe: str
    module: str
    status: str
    kind: str
    config_text: str
    model: str | None
    created_at: float
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    error: str | None
    parent_id: str | None
    pid: int | None
    pgid: int | None
    supervisor_pid: int | None
    supervisor_started: float | None
    nproc: int
    host: str
    output_dir: str
    tags: str
    notes: str
    step: int
    total_steps: int | None
    stop_requested: bool
    resumes: int
    nnodes: int = 1
    rdzv_endpoint: str | None = None
    slurm_job_id: str | None = None
    queue_pos: int | None = None  # its place in the run queue while it waits there (None: not waiting)

    @property
    def tag_list(self) -> list[str]:
        return [t for t in self.tags.split(",") if t]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


RUN_COLUMNS = tuple(f.name for f in dataclasses.fields(RunRecord))


@dataclass(frozen=True)
class RunSummary:
    """A run plus the figures the runs table shows.

    `last_loss`: rank-0 `loss` at the last step that logged one; `tokens_per_sec_median`: median of
    `tokens_per_sec` over all steps; `mem_peak_gb`: max `mem_peak_gb` over steps and ranks;
    `eta_s`: seconds left from the recent step rate (None unless running with a known total).
    """

    run: RunRecord
    last_loss: float | None
    tokens_per_sec_median: float | None
    mem_peak_gb: float | None
    eta_s: float | None

    def to_dict(self) -> dict:
        d = self.run.to_dict()
        d.pop("config_text")
        d.update(
            last_loss=self.last_loss,
            tokens_per_sec_median=self.tokens_per_sec_median,
            mem_peak_gb=self.mem_peak_gb,
            eta_s=self.eta_s,
        )
        return d


@dataclass(frozen=True)
class MetricRow:
    id: int
    step: int
    name: str
    value: float  # NaN where the run logged NaN
    time: float
    rank: int


@dataclass(frozen=True)
class EventRow:
    id: int
    step: int
    kind: str
    text: str
    time: float
    rank: int


@dataclass(frozen=True)
class EvalRow:
    id: int
    step: int
    task: str
    metric: str
    value: float
    checkpoint: str | None
    time: float
