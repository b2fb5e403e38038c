"""Evaluation scores (`eval_results`): one row per task/metric, one column per run or per step."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from textual.widgets import DataTable


def latest_scores(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], tuple[int, float]]:
    """`(task, metric) -> (step, value)` of the highest step seen for each pair (rows in any order)."""
    out: dict[tuple[str, str], tuple[int, float]] = {}
    for r in rows:
        key = (str(r["task"]), str(r["metric"]))
        if key not in out or int(r["step"]) >= out[key][0]:
            out[key] = (int(r["step"]), float(r["value"]))
    return out


def fmt_score(value: float) -> str:
    """A score with 4 significant digits; NaN as `nan`."""
    return "nan" if math.isnan(value) else f"{value:.4g}"


class EvalTable(DataTable):
    """`show_runs({run name: rows})` (Compare: latest score of each run and its step) or
    `show_steps(rows)` (Live run: one run's scores at its last `max_steps` evaluated steps).

    Rows are dicts with step, task, metric, value. The table hides itself while it has no scores.
    """

    DEFAULT_CSS = """
    EvalTable {
        height: auto;
        max-height: 8;
    }
    EvalTable.-empty {
        display: none;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="none", zebra_stripes=True, **kwargs)
        self.add_class("-empty")
        self.border_title = "evaluation"

    def show_runs(self, rows_by_run: dict[str, list[dict[str, Any]]]) -> None:
        latest = {name: latest_scores(rows) for name, rows in rows_by_run.items()}
        keys = sorted({k for scores in latest.values() for k in scores})
        self.clear(columns=True)
        self.set_class(not keys, "-empty")
        if not keys:
            return
        self.add_columns("task / metric", *latest)
        for key in keys:
            cells = []
            for scores in latest.values():
                step, value = scores.get(key, (None, None))
                cells.append("-" if step is None else f"{fmt_score(value)} @{step}")
            self.add_row(f"{key[0]} / {key[1]}", *cells)

    def show_steps(self, rows: list[dict[str, Any]], max_steps: int = 6) -> None:
        steps = sorted({int(r["step"]) for r in rows})[-max_steps:]
        table: dict[tuple[str, str], dict[int, float]] = {}
        for r in rows:
            if int(r["step"]) in steps:
                table.setdefault((str(r["task"]), str(r["metric"])), {})[int(r["step"])] = float(r["value"])
        self.clear(columns=True)
        self.set_class(not table, "-empty")
        if not table:
            return
        self.add_columns("task / metric", *(f"step {s}" for s in steps))
        for key in sorted(table):
            self.add_row(
                f"{key[0]} / {key[1]}",
                *(fmt_score(table[key][s]) if s in table[key] else "-" for s in steps),
            )
