"""Data: compose a dataset mix. Add sources (a built-in preset, a local file, a Hub id), choose the
builder, template or chat format, column map, `train_on_input` and weight; see one rendered sample
with the loss-masked spans dimmed, and token-length statistics for each source.

The mix is handed to the Recipe screen (`ctrl+d` there, or `u` here opens it with the mix applied).
"""

from __future__ import annotations

from typing import Any

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Checkbox, DataTable, Footer, Input, Label, Select

from workbench import services
from workbench.data_mix import (
    BUILDERS,
    KINDS,
    PRESETS,
    SourceForm,
    mix_node,
    source_name,
    source_node,
)
from workbench.errors import UserError
from workbench.ui_messages import PreviewReady
from workbench.widgets.sample_preview import SamplePreview
from workbench.widgets.title_header import TitleHeader


class DataScreen(Screen):
    """Data: compose a dataset mix and preview what the model will be trained on."""

    TITLE = "Data"
    BINDINGS = [
        Binding("ctrl+a", "add", "add source"),
        Binding("delete", "remove", "remove"),
        Binding("ctrl+n", "next_sample", "next sample"),
        Binding("ctrl+b", "prev_sample", "prev sample", show=False),
        Binding("ctrl+u", "use", "use in recipe"),
        Binding("escape", "back", "back"),
    ]
    DEFAULT_CSS = """
    DataScreen #data-form {
        width: 44;
        border: round $panel;
    }
    DataScreen #data-form Label {
        padding: 0 1;
        color: $text-muted;
    }
    DataScreen #data-form Input, DataScreen #data-form Select {
        margin: 0 1;
    }
    DataScreen #data-form Checkbox {
        border: none;
    }
    DataScreen #data-right {
        width: 1fr;
    }
    DataScreen #sources {
        height: auto;
        max-height: 10;
        border: round $panel;
    }
    DataScreen #data-status {
        height: 1;
        padding: 0 1;
    }
    """

    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[dict[str, Any]] = []
        self.weights: list[float] = []
        self.stats: list[dict | None] = []
        self.sample_index = 0

    def compose(self) -> ComposeResult:
        yield TitleHeader()
        with Horizontal():
            with VerticalScroll(id="data-form"):
                yield Label("kind")
                yield Select(
                    [(k, k) for k in KINDS], value="preset", allow_blank=False, id="kind", compact=True
                )
                yield Label("preset")
                yield Select(
                    [(p, p) for p in PRESETS], value="demo", allow_blank=False, id="preset", compact=True
                )
                yield Label("source: file path or Hub id (presets: a local copy)")
                yield Input(id="source", compact=True)
                yield Label("builder")
                yield Select(
                    [(b, b) for b in BUILDERS],
                    value="instruct",
                    allow_blank=False,
                    id="builder",
                    compact=True,
                )
                yield Label("template (e.g. engine.data.AlpacaInstructTemplate or {question})")
                yield Input(id="template", compact=True)
                yield Label("chat format (e.g. chatml, tokenizer)")
                yield Input(id="chat-format", compact=True)
                yield Label("column map (field=column, ...)")
                yield Input(id="column-map", compact=True)
                yield Checkbox("train on input", False, id="train-on-input")
                yield Label("weight")
                yield Input("1", id="weight", compact=True)
                yield Label("tokenizer for the preview (empty: the demo model's)")
                yield Input(id="tokenizer", compact=True)
                yield Button("add source", id="add", variant="primary")
            with Vertical(id="data-right"):
                yield DataTable(id="sources", cursor_type="row")
                yield Label("", id="data-status")
                yield SamplePreview("add a source to preview it")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#data-form").border_title = "add a source"
        table = self.query_one("#sources", DataTable)
        table.border_title = "mix"
        table.add_columns("name", "component", "source", "weight", "samples", "mean", "p50", "p95", "max")
        node = getattr(self.app, "dataset_node", None)
        if node:  # coming back to the Data screen: show the mix composed before
            if node.get("_component_") == "engine.data.mix":
                pairs = list(zip(node["datasets"], node["weights"]))
            else:
                pairs = [(node, 1.0)]
            for part, weight in pairs:
                self.nodes.append(dict(part))
                self.weights.append(float(weight))
                self.stats.append(None)
            self._sync()

    def form(self) -> SourceForm:
        def val(wid: str) -> str:
            return self.query_one(f"#{wid}", Input).value

        try:
            weight = float(val("weight") or 1)
        except ValueError:
            raise UserError(f"weight: {val('weight')!r} is not a number") from None
        return SourceForm(
            kind=str(self.query_one("#kind", Select).value),
            preset=str(self.query_one("#preset", Select).value),
            source=val("source"),
            builder=str(self.query_one("#builder", Select).value),
            template=val("template"),
            chat_format=val("chat-format"),
            column_map=val("column-map"),
            train_on_input=self.query_one("#train-on-input", Checkbox).value,
            weight=weight,
        )

    @on(Button.Pressed, "#add")
    def _add_pressed(self) -> None:
        self.action_add()

    def action_add(self) -> None:
        try:
            form = self.form()
            node = source_node(form)
        except UserError as exc:
            self._status(str(exc), error=True)
            return
        self._add_node(node, form.weight)

    def _add_node(self, node: dict[str, Any], weight: float) -> None:
        self.nodes.append(node)
        self.weights.append(weight)
        self.stats.append(None)
        self._sync()
        table = self.query_one("#sources", DataTable)
        with self.prevent(DataTable.RowHighlighted):
            table.move_cursor(row=len(self.nodes) - 1)
        self.sample_index = 0
        self.preview(len(self.nodes) - 1)

    def action_remove(self) -> None:
        table = self.query_one("#sources", DataTable)
        if not self.nodes:
            return
        i = table.cursor_row
        for seq in (self.nodes, self.weights, self.stats):
            seq.pop(i)
        self._sync()

    def _cells(self, i: int) -> list[str]:
        node, weight, s = self.nodes[i], self.weights[i], self.stats[i] or {}
        stats = [str(s["count"]) if "count" in s else "…"]
        stats += [f"{s[k]:.0f}" if k in s else "…" for k in ("mean", "p50", "p95")]
        stats += [str(s["max"]) if "max" in s else "…"]
        return [
            source_name(node, i),
            str(node["_component_"]).rsplit(".", 1)[-1],
            str(node.get("source", "(preset)")),
            f"{weight:g}",
            *stats,
        ]

    def _sync(self) -> None:
        """Redraw the mix table and hand the mix to the app (the Recipe screen reads it)."""
        table = self.query_one("#sources", DataTable)
        with self.prevent(DataTable.RowHighlighted):
            table.clear()
            for i in range(len(self.nodes)):
                table.add_row(*self._cells(i))
        self.app.dataset_mix = [dict(n) for n in self.nodes]
        self.app.dataset_node = mix_node(self.nodes, self.weights)

    def _update_stats_row(self, i: int) -> None:
        table = self.query_one("#sources", DataTable)
        for col, value in enumerate(self._cells(i)):
            table.update_cell_at((i, col), value)

    @on(DataTable.RowHighlighted, "#sources")
    def _row(self, event: DataTable.RowHighlighted) -> None:
        self.sample_index = 0
        self.preview(event.cursor_row)

    def action_next_sample(self) -> None:
        self.sample_index += 1
        self.preview(self.query_one("#sources", DataTable).cursor_row)

    def action_prev_sample(self) -> None:
        self.sample_index = max(0, self.sample_index - 1)
        self.preview(self.query_one("#sources", DataTable).cursor_row)

    def preview(self, row: int) -> None:
        """Build source `row`'s sample `sample_index` in a worker (its inputs read here, on the UI thread)."""
        if not (0 <= row < len(self.nodes)):
            return
        self._status(f"building {source_name(self.nodes[row], row)}…")
        tokenizer = self.query_one("#tokenizer", Input).value.strip()
        self._preview(row, self.nodes[row], tokenizer, self.sample_index)

    @work(thread=True, exclusive=True, group="data-preview")
    def _preview(self, row: int, node: dict, tokenizer: str, index: int) -> None:
        try:
            result = services.preview_source(node, tokenizer, index)
        except Exception as exc:  # a bad source: one line naming it
            self.post_message(PreviewReady(row, error=str(exc).splitlines()[0]))
            return
        self.post_message(PreviewReady(row, result=result))

    def on_preview_ready(self, message: PreviewReady) -> None:
        if message.error:
            self._status(message.error, error=True)
            self.query_one(SamplePreview).show_message(message.error)
            return
        row, result = message.row, message.result
        if row < len(self.stats):
            self.stats[row] = result["stats"]
            self._update_stats_row(row)
        self.query_one(SamplePreview).show(result["segments"])
        self._status(
            f"sample {result['index'] + 1}/{result['length']}: {result['num_tokens']} tokens, "
            f"{result['num_trained']} trained"
        )

    def _status(self, text: str, error: bool = False) -> None:
        label = self.query_one("#data-status", Label)
        label.update(text)
        label.set_class(error, "-error")
        label.styles.color = "red" if error else None

    def action_use(self) -> None:
        if not self.nodes:
            self.notify("add a source first", severity="warning")
            return
        screen = self.app.make_screen("recipe", use_mix=True)
        self.app.push_screen(screen)

    def action_back(self) -> None:
        self.app.pop_screen()
