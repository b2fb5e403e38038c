"""Messages workers post back to the screens (small dataclasses; posting is thread-safe)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message


@dataclass
class RunsLoaded(Message):
    """Fresh rows for the runs table (one dict per run, see `workbench.screens.services.run_row`)."""

    rows: list[dict[str, Any]]


@dataclass
class RunDataArrived(Message):
    """New metrics/events/log text of one run since the last poll of a live or compare view."""

    run_id: str
    run: dict[str, Any]
    metrics: dict[str, dict[int, list[tuple[int, float]]]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    log_text: str = ""
    step_times: list[tuple[int, float]] = field(default_factory=list)  # (step, wall time) of rank-0 loss rows
    evals: list[dict[str, Any]] | None = None  # all eval scores (step, task, metric, value); None: unchanged


@dataclass
class ActionDone(Message):
    """An action (launch, stop, resume, export, ...) finished; `ok` False means `text` is the error."""

    action: str
    text: str
    ok: bool = True
    run_id: str | None = None
    payload: Any = None
