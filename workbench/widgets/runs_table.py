"""The table of runs: live rows, a text filter, sort by any column, and multi-select marks."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from rich.text import Text
from textual.widgets import DataTable

# (key in a run row, header, width)
COLUMNS: tuple[tuple[str, str], ...] = (
    ("mark", " "),
    ("name", "name"),
    ("status", "status"),
    ("recipe", "recipe"),
    ("model", "model"),
    ("last_loss", "loss"),
    ("tokens_per_sec", "tok/s"),
    ("mem_peak_gb", "peak GB"),
    ("started", "started"),
    ("duration", "time"),
    ("parent", "parent"),
)
STATUS_STYLE = {
    "running": "bold green",
    "queued": "yellow",
    "completed": "cyan",
    "failed": "bold red",
    "stopped": "magenta",
    "cancelled": "dim",
}


def _num(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    return "nan" if math.isnan(v) else format(v, fmt)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{(s % 3600) // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def format_started(ts: float | None) -> str:
    if not ts:
        return "-"
    return time.strftime("%m-%d %H:%M", time.localtime(ts))


def cell_values(row: Mapping[str, Any], marked: bool) -> list[Any]:
    """The table cells of one run row (a mapping with the keys in COLUMNS)."""
    status = str(row.get("status") or "-")
    place = row.get("queue_pos")  # waiting in the run queue: its place there
    shown = f"{status} #{place}" if place and status == "queued" else status
    return [
        "●" if marked else " ",
        str(row.get("name") or row.get("id")),
        Text(shown, style=STATUS_STYLE.get(status, "")),
        str(row.get("recipe") or "-"),
        str(row.get("model") or "-"),
        _num(row.get("last_loss"), ".4f"),
        _num(row.get("tokens_per_sec"), ",.0f"),
        _num(row.get("mem_peak_gb"), ".2f"),
        format_started(row.get("started")),
        format_duration(row.get("duration")),
        str(row.get("parent") or ""),
    ]


def sort_key(row: Mapping[str, Any], column: str) -> tuple:
    """Sort None last; numbers numerically; everything else as text."""
    value = row.get(column)
    if value is None:
        return (1, 0, "")
    if isinstance(value, (int, float)):
        return (0, value, "")
    return (0, 0, str(value).lower())


def matches(row: Mapping[str, Any], text: str) -> bool:
    """Filter: every word must appear in the id, name, status, recipe, model, tags or notes."""
    hay = " ".join(
        str(row.get(k) or "") for k in ("id", "name", "status", "recipe", "model", "tags", "notes")
    ).lower()
    return all(word in hay for word in text.lower().split())


class RunsTable(DataTable):
    """Rows keyed by run id. `set_rows` keeps the cursor and marks; space toggles a mark."""

    DEFAULT_CSS = """
    RunsTable {
        height: 1fr;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.rows_by_id: dict[str, dict[str, Any]] = {}
        self.marked: set[str] = set()
        self.filter_text = ""
        self.sort_column = "started"
        self.sort_reverse = True

    def on_mount(self) -> None:
        for key, header in COLUMNS:
            self.add_column(header, key=key)

    @property
    def visible_ids(self) -> list[str]:
        rows = [r for r in self.rows_by_id.values() if matches(r, self.filter_text)]
        rows.sort(key=lambda r: sort_key(r, self.sort_column), reverse=self.sort_reverse)
        return [str(r["id"]) for r in rows]

    def set_rows(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Replace the data; redraw only cells that changed when the visible order is unchanged."""
        self.rows_by_id = {str(r["id"]): dict(r) for r in rows}
        self.marked &= set(self.rows_by_id)
        self._redraw()

    def _redraw(self) -> None:
        ids = self.visible_ids
        current = [str(k.value) for k in self.rows]
        if ids == current:
            for rid in ids:
                for (key, _), value in zip(COLUMNS, cell_values(self.rows_by_id[rid], rid in self.marked)):
                    if str(self.get_cell(rid, key)) != str(value):
                        self.update_cell(rid, key, value)
            return
        cursor_id = self.cursor_run_id
        self.clear()
        for rid in ids:
            self.add_row(*cell_values(self.rows_by_id[rid], rid in self.marked), key=rid)
        if cursor_id in ids:
            self.move_cursor(row=ids.index(cursor_id))

    @property
    def cursor_run_id(self) -> str | None:
        if not self.row_count:
            return None
        try:
            return str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)
        except Exception:  # cursor outside the table after a clear
            return None

    def selected_ids(self) -> list[str]:
        """The marked runs in table order, or the run under the cursor when none is marked."""
        if self.marked:
            return [rid for rid in self.visible_ids if rid in self.marked]
        rid = self.cursor_run_id
        return [rid] if rid else []

    def toggle_mark(self) -> None:
        rid = self.cursor_run_id
        if rid is None:
            return
        self.marked ^= {rid}
        self.update_cell(rid, "mark", "●" if rid in self.marked else " ")

    def set_filter(self, text: str) -> None:
        self.filter_text = text
        self._redraw()

    def sort_by(self, column: str) -> None:
        """Sort by `column`; sorting by the same column again flips the order."""
        if column == self.sort_column:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_column, self.sort_reverse = column, column in ("started", "duration")
        self._redraw()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        if event.column_key.value != "mark":
            self.sort_by(str(event.column_key.value))
