"""Evaluation scores (`eval_results`): one row per task/metric, one column per run or per step."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from textual.widgets import DataTable

BASE = "base"  # engine.tracking.records.BASE_CHECKPOINT (not imported: widgets stay light)


def is_base(row: dict[str, Any]) -> bool:
    """A score of the run's base model (`tunebench eval RUN --base`), not of one of its checkpoints."""
    return row.get("checkpoint") == BASE


def latest_scores(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], tuple[int, float]]:
    """`(task, metric) -> (step, value)` of the highest step seen for each pair (rows in any order;
    base-model rows are left out)."""
    out: dict[tuple[str, str], tuple[int, float]] = {}
    for r in rows:
        if is_base(r):
            continue
        key = (str(r["task"]), str(r["metric"]))
        if key not in out or int(r["step"]) >= out[key][0]:
            out[key] = (int(r["step"]), float(r["value"]))
    return out


def base_scores(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """`(task, metric) -> value` of the base-model rows (the newest of each pair wins)."""
    out: dict[tuple[str, str], float] = {}
    for r in sorted((r for r in rows if is_base(r)), key=lambda r: int(r["step"])):
        out[(str(r["task"]), str(r["metric"]))] = float(r["value"])
    return out


def fmt_score(value: float) -> str:
    """A score with 4 significant digits; NaN as `nan`."""
    return "nan" if math.isnan(value) else f"{value:.4g}"


class EvalTable(DataTable):
    """`show_runs({run name: rows})` (Compare: latest score of each run and its step, and beside it a
    `<name> base` column when the run's base model was scored) or `show_steps(rows)` (Live run: one
    run's scores at its last `max_steps` evaluated steps, and its base model's).

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

    def watch_virtual_size(self) -> None:
        """Lay the screen out again once the table knows its height. DataTable measures its rows when
        idle, after the screen may already have laid it out with no rows; Textual keeps that layout
        when the size change arrives while another layout is pending (seen under load: the table
        stayed 0 rows high). A layout asked for after the next refresh is never folded into one
        already pending."""
        self.call_after_refresh(self.refresh, layout=True)

    def show_runs(self, rows_by_run: dict[str, list[dict[str, Any]]]) -> None:
        columns: dict[str, dict[tuple[str, str], str]] = {}
        for name, rows in rows_by_run.items():
            columns[name] = {k: f"{fmt_score(v)} @{s}" for k, (s, v) in latest_scores(rows).items()}
            base = base_scores(rows)
            if base:
                columns[f"{name} base"] = {k: fmt_score(v) for k, v in base.items()}
        keys = sorted({k for cells in columns.values() for k in cells})
        self.clear(columns=True)
        self.set_class(not keys, "-empty")
        if not keys:
            return
        self.add_columns("task / metric", *columns)
        for key in keys:
            self.add_row(f"{key[0]} / {key[1]}", *(cells.get(key, "-") for cells in columns.values()))

    def show_steps(self, rows: list[dict[str, Any]], max_steps: int = 6) -> None:
        base = base_scores(rows)
        rows = [r for r in rows if not is_base(r)]
        steps = sorted({int(r["step"]) for r in rows})[-max_steps:]
        table: dict[tuple[str, str], dict[int, float]] = {}
        for r in rows:
            if int(r["step"]) in steps:
                table.setdefault((str(r["task"]), str(r["metric"])), {})[int(r["step"])] = float(r["value"])
        keys = sorted(set(table) | set(base))
        self.clear(columns=True)
        self.set_class(not keys, "-empty")
        if not keys:
            return
        self.add_columns("task / metric", *(["base"] if base else []), *(f"step {s}" for s in steps))
        for key in keys:
            cells = [fmt_score(base[key]) if key in base else "-"] if base else []
            at = table.get(key, {})
            cells += [fmt_score(at[s]) if s in at else "-" for s in steps]
            self.add_row(f"{key[0]} / {key[1]}", *cells)
