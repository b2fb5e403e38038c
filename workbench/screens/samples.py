"""GRPO sample completions of one run (`samples.jsonl`), newest first, re-read while the run trains."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label, Static

from workbench import services
from workbench.ui_messages import SamplesLoaded, WorkFailed
from workbench.widgets.title_header import TitleHeader


def one_line(text: Any, width: int) -> str:
    """`text` on one line (newlines shown as ⏎), cut to `width` characters with an ellipsis."""
    flat = "" if text is None else str(text).replace("\n", " ⏎ ")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


class SamplesScreen(Screen):
    """Sample completions of a GRPO run: step, reward, prompt, completion and answer, newest first.

    The highlighted row is shown in full below the table. Rows are read by a worker every poll.
    """

    TITLE = "Samples"
    BINDINGS = [Binding("q,escape", "back", "back")]
    DEFAULT_CSS = """
    SamplesScreen DataTable {
        height: 1fr;
    }
    SamplesScreen #sample-full {
        height: 9;
        border: round $panel;
        padding: 0 1;
        overflow-y: auto;
    }
    SamplesScreen #samples-title {
        height: 1;
        padding: 0 1;
        text-style: bold;
    }
    """

    def __init__(self, run_id: str, output_dir: str | None = None) -> None:
        super().__init__()
        self.run_id = run_id
        self.output_dir = output_dir
        self.rows: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        yield TitleHeader()
        yield Label(f"samples of run {self.run_id} (newest first)", id="samples-title")
        table = DataTable(cursor_type="row", zebra_stripes=True)
        table.add_columns("step", "reward", "prompt", "completion", "answer")
        yield table
        yield Static("no samples yet (GRPO writes num_samples_to_log per step)", id="sample-full")
        yield Footer()

    def on_mount(self) -> None:
        self.load()
        self.set_interval(max(1.0, self.app.interval * 2), self.load)

    def load(self) -> None:
        self._load(self.run_id, self.output_dir)

    @work(thread=True, group="samples", exclusive=True)
    def _load(self, run_id: str, output_dir: str | None) -> None:
        try:
            rows = services.read_samples(run_id, output_dir)
        except Exception as exc:
            self.post_message(WorkFailed("samples", f"cannot read samples of {run_id}: {exc}"))
            return
        self.post_message(SamplesLoaded(rows))

    def on_samples_loaded(self, message: SamplesLoaded) -> None:
        self.show_rows(message.rows)

    def show_rows(self, rows: list[dict[str, Any]]) -> None:
        """Replace the table's rows (keeps the cursor row index) unless nothing changed."""
        if rows == self.rows:
            return
        self.rows = rows
        table = self.query_one(DataTable)
        cursor = table.cursor_row
        table.clear()
        width = max(12, (self.size.width or 100) // 3)
        for row in rows:
            reward = row["reward"]
            table.add_row(
                str(row["step"]),
                f"{reward:.3f}" if isinstance(reward, (int, float)) else str(reward),
                one_line(row["prompt"], width // 2),
                one_line(row["completion"], width),
                one_line(row["answer"], 16),
            )
        if rows:
            table.move_cursor(row=min(cursor, len(rows) - 1))
            self._show_full(min(cursor, len(rows) - 1))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_full(event.cursor_row)

    def _show_full(self, index: int) -> None:
        if not 0 <= index < len(self.rows):
            return
        row = self.rows[index]
        text = Text(f"step {row['step']}  reward {row['reward']}  answer {row['answer']}\n")
        text.append("prompt\n", style="bold")
        text.append(f"{row['prompt']}\n")
        text.append("completion\n", style="bold")
        text.append(str(row["completion"]))
        self.query_one("#sample-full", Static).update(text)  # Text: a prompt's [brackets] stay literal

    def action_back(self) -> None:
        self.app.pop_screen()

    def on_work_failed(self, message: WorkFailed) -> None:
        self.notify(message.text, severity="error")
