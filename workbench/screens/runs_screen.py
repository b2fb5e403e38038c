"""Runs: every run in the tracker, updated live. Open, compare, resume, clone, stop, export (the
config as YAML, or the model as GGUF), delete, tag and annotate runs from here; queue runs, reorder
and cancel them, pause the queue, and compare a sweep ranked best first.

Space marks runs for compare or bulk actions; without marks an action applies to the run under
the cursor. Quitting the workbench never stops a run. An empty tracker (a first start) shows what
tunebench is and offers the demo: `n` opens the Recipe screen on the demo config with its expected
time on this machine, and enter there launches it.
"""

from __future__ import annotations

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Input, Label, Static

from workbench import run_queue, services
from workbench.commands.export_model import TYPES as GGUF_TYPES
from workbench.screens.confirm import ChoiceScreen, ConfirmScreen, TextPromptScreen, TypedConfirmScreen
from workbench.ui_messages import ModelExported, RunActionDone, RunsLoaded, WorkFailed
from workbench.widgets.runs_table import COLUMNS, RunsTable
from workbench.widgets.title_header import TitleHeader

SORTABLE = [key for key, _ in COLUMNS if key != "mark"]
FIRST_RUN = (
    "tunebench fine-tunes language models (SFT full / LoRA / QLoRA, DPO, distillation, GRPO) and "
    "tracks every run here, live.\n"
    "No runs yet: press [b]n[/b] to set up the demo (LoRA on the embedded SmolLM2-135M-Instruct, "
    "nothing to download); the Recipe screen shows its expected time, [b]enter[/b] launches it."
)


class RunsScreen(Screen):
    """Runs: every run in the tracker, updated live; the home screen."""

    TITLE = "Runs"
    DEFAULT_CSS = """
    RunsScreen #first-run {
        height: auto;
        border: round $accent;
        padding: 0 1;
        margin: 1 2;
    }
    """
    BINDINGS = [
        Binding("enter", "open", "open"),
        Binding("space", "mark", "mark", show=False),
        Binding("slash", "filter", "filter", key_display="/"),
        Binding("s", "sort", "sort"),
        Binding("c", "compare", "compare"),
        Binding("n", "new", "new run"),
        Binding("r", "resume", "resume", show=False),
        Binding("k", "clone", "clone", show=False),
        Binding("x", "stop", "stop / cancel queued", show=False),
        Binding("u", "queue", "queue (a clone of an ended run)", show=False),
        Binding("shift+up", "queue_move('up')", "earlier in the queue", show=False),
        Binding("shift+down", "queue_move('down')", "later in the queue", show=False),
        Binding("P", "queue_pause", "pause / resume the queue", show=False),
        Binding("w", "compare_sweep", "compare the run's sweep, ranked", show=False),
        Binding("e", "export", "export YAML", show=False),
        Binding("g", "export_gguf", "export GGUF", show=False),
        Binding("D", "delete", "delete", show=False),
        Binding("t", "tag", "tag", show=False),
        Binding("o", "note", "note", show=False),
        Binding("a", "chat", "chat in the Playground (no runs: the demo model)", show=False),
        Binding("q", "quit_app", "quit"),
        Binding("escape", "clear_filter", "clear filter", show=False),
    ]

    def compose(self) -> ComposeResult:
        yield TitleHeader()
        yield Input(placeholder="filter: words in name, status, recipe, model, tags", id="filter")
        yield Static(FIRST_RUN, id="first-run")
        yield RunsTable(id="runs")
        yield Label("", id="runs-status")
        yield Footer()

    empty: bool | None = None  # the tracker has no run (None until the first poll answers)

    def on_mount(self) -> None:
        self.query_one("#filter").display = False
        self.query_one("#first-run").display = False
        self.query_one("#first-run").border_title = "welcome"
        self.query_one(RunsTable).focus()
        self.refresh_runs()
        self.set_interval(self.app.interval * 2, self.refresh_runs)

    def on_screen_resume(self) -> None:
        self.refresh_runs()

    # Data -----------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="runs-poll")
    def refresh_runs(self) -> None:
        try:
            rows = services.list_runs()
            queue = run_queue.screen_view()
        except Exception as exc:  # the tracker is unreadable: say so once in the status line
            self.post_message(WorkFailed("runs", f"cannot read the tracker: {exc}"))
            return
        for row in rows:
            row["queue_pos"] = queue["places"].get(row["id"])
        self.post_message(RunsLoaded(rows, queue))

    def on_runs_loaded(self, message: RunsLoaded) -> None:
        table = self.query_one(RunsTable)
        table.set_rows(message.rows)
        self.empty = not message.rows
        self.query_one("#first-run").display = self.empty
        running = sum(1 for r in message.rows if r["status"] == "running")
        shown = len(table.visible_ids)
        queue = message.queue or {}
        waiting = len(queue.get("places") or {})
        self._status(
            f"{shown}/{len(message.rows)} runs, {running} running, sort: {table.sort_column}"
            + (" (desc)" if table.sort_reverse else "")
            + (f", {len(table.marked)} marked" if table.marked else "")
            + (f", queue: {waiting} waiting" if waiting or queue.get("paused") else "")
            + (" (paused: P resumes)" if queue.get("paused") else "")
        )

    def _status(self, text: str) -> None:
        self.query_one("#runs-status", Label).update(text)

    # Filter and sort ------------------------------------------------------------------------
    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.query_one(RunsTable).set_filter(event.value)

    @on(Input.Submitted, "#filter")
    def _filter_done(self) -> None:
        self.query_one(RunsTable).focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        if box.value or box.display:
            box.value = ""
            box.display = False
            self.query_one(RunsTable).set_filter("")
            self.query_one(RunsTable).focus()

    def action_sort(self) -> None:
        table = self.query_one(RunsTable)
        i = SORTABLE.index(table.sort_column) if table.sort_column in SORTABLE else -1
        table.sort_by(SORTABLE[(i + 1) % len(SORTABLE)])
        self._status(f"sort: {table.sort_column}" + (" (desc)" if table.sort_reverse else ""))

    def action_mark(self) -> None:
        self.query_one(RunsTable).toggle_mark()

    # Actions --------------------------------------------------------------------------------
    def _selected(self, *, one: bool = False) -> list[str]:
        ids = self.query_one(RunsTable).selected_ids()
        if not ids:
            self.notify("no run selected", severity="warning")
        return ids[:1] if one else ids

    def _run_name(self, run_id: str) -> str:
        return str(self.query_one(RunsTable).rows_by_id.get(run_id, {}).get("name") or run_id)

    def action_open(self) -> None:
        for rid in self._selected(one=True):
            self.app.push_screen(self.app.make_screen("live", run_id=rid))

    def on_data_table_row_selected(self, event) -> None:
        event.stop()
        self.action_open()

    def action_compare(self) -> None:
        ids = self.query_one(RunsTable).selected_ids()
        if len(ids) < 2:
            self.notify("mark two or more runs with space, then press c", severity="warning")
            return
        self.app.push_screen(self.app.make_screen("compare", run_ids=ids))

    def action_chat(self) -> None:
        """The Playground on the selected run (two marked runs: side by side); no runs: the demo model."""
        ids = self.query_one(RunsTable).selected_ids()
        self.app.push_screen(self.app.make_screen("playground", models=ids[:2] or ["demo"]))

    def action_new(self) -> None:
        if self.empty:  # a first start: the demo, with a banner and enter to launch
            from workbench.screens.recipe import DEFAULT_CONFIG

            self.app.push_screen(self.app.make_screen("recipe", config=DEFAULT_CONFIG, first_run=True))
            return
        self.app.push_screen(self.app.make_screen("recipe"))

    def action_clone(self) -> None:
        for rid in self._selected(one=True):
            self.app.push_screen(self.app.make_screen("recipe", clone_of=rid))

    def action_resume(self) -> None:
        for rid in self._selected():
            self._run_action("resume", rid)

    def _waiting(self, run_id: str) -> bool:
        row = self.query_one(RunsTable).rows_by_id.get(run_id, {})
        return row.get("status") == "queued" and bool(row.get("queue_pos"))

    def action_stop(self) -> None:
        ids = self._selected()
        if not ids:
            return
        names = ", ".join(self._run_name(r) for r in ids)
        if all(self._waiting(r) for r in ids):  # waiting in the queue: they never ran, cancel them

            def cancel(yes: bool | None) -> None:
                if yes:
                    for rid in ids:
                        self._run_action("cancel", rid)

            self.app.push_screen(ConfirmScreen(f"Cancel {names}? (taken out of the queue)"), cancel)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                for rid in ids:
                    self._run_action("stop", rid)

        self.app.push_screen(ConfirmScreen(f"Stop {names}? (a checkpoint is saved first)"), answered)

    def action_export(self) -> None:
        for rid in self._selected(one=True):
            default = f"{self._run_name(rid)}.yaml"

            def chosen(path: str | None, rid=rid) -> None:
                if path:
                    self._run_action("export", rid, path)

            self.app.push_screen(TextPromptScreen("Export the run's config as YAML to:", default), chosen)

    def action_export_gguf(self) -> None:
        for rid in self._selected(one=True):
            name = self._run_name(rid)

            def chosen(qtype: str | None, rid=rid, name=name) -> None:
                if qtype:
                    self.notify(f"{name}: exporting the latest checkpoint as {qtype} GGUF ...")
                    self._export_gguf(rid, qtype)

            self.app.push_screen(
                ChoiceScreen(
                    f"Export {name}'s merged model as GGUF (llama.cpp, Ollama); storage:", GGUF_TYPES
                ),
                chosen,
            )

    @work(thread=True, group="gguf-export")
    def _export_gguf(self, run_id: str, qtype: str) -> None:
        from workbench.commands.export_model import export_run_gguf_message

        self.post_message(export_run_gguf_message(run_id, qtype))

    def on_model_exported(self, message: ModelExported) -> None:
        name = self._run_name(message.run_id)
        if message.error:
            self.notify(f"{name}: GGUF export failed: {message.error}", severity="error", timeout=10)
        else:
            self.notify(f"{name}: wrote {message.path}", timeout=10)

    def action_delete(self) -> None:
        for rid in self._selected(one=True):
            name = self._run_name(rid)

            def answered(yes: bool | None, rid=rid) -> None:
                if yes:
                    self._run_action("delete", rid)

            self.app.push_screen(
                TypedConfirmScreen(
                    f"Delete run {name}, its metrics and the files it wrote (checkpoints, logs)?", name
                ),
                answered,
            )

    def action_tag(self) -> None:
        self._edit_text("tags", "tag", "Tags (comma separated):")

    def action_note(self) -> None:
        self._edit_text("notes", "note", "Note:")

    def _edit_text(self, column: str, action: str, prompt: str) -> None:
        """Ask for the run's new `column` text (prefilled with the current one), then `action` with it."""
        for rid in self._selected(one=True):
            current = str(self.query_one(RunsTable).rows_by_id[rid].get(column) or "")

            def chosen(text: str | None, rid=rid) -> None:
                if text is not None:
                    self._run_action(action, rid, text)

            self.app.push_screen(TextPromptScreen(prompt, current), chosen)

    def action_queue(self) -> None:
        ids = self._selected()
        if ids:
            self._queue_action("queue", ids)

    def action_queue_move(self, where: str) -> None:
        for rid in self._selected(one=True):
            if not self._waiting(rid):
                self.notify(f"{self._run_name(rid)} is not waiting in the queue", severity="warning")
                return
            self._queue_action("move", [rid], where)

    def action_queue_pause(self) -> None:
        self._queue_action("pause", [])

    @work(thread=True, group="runs-queue")
    def _queue_action(self, action: str, run_ids: list[str], arg: str = "") -> None:
        """Queue, move (relative moves add up: each is read and written in one transaction), pause/resume."""
        rid = run_ids[0] if run_ids else None
        try:
            if action == "queue":
                text = run_queue.queue_selected(run_ids)
            elif action == "move":
                text = f"place {run_queue.move(run_ids[0], arg)} in the queue"
            else:
                text = "queue paused" if run_queue.toggle_paused() else "queue resumed"
        except Exception as exc:  # shown as a toast; the message names what to change
            self.post_message(RunActionDone(action, str(exc), rid, ok=False))
            return
        self.post_message(RunActionDone(action, text, rid if action == "move" else None))

    def action_compare_sweep(self) -> None:
        from workbench.sweeps import sweep_of

        for rid in self._selected(one=True):
            name = sweep_of(self.query_one(RunsTable).rows_by_id.get(rid, {}))
            if name is None:
                self.notify(
                    f"{self._run_name(rid)} is not part of a sweep (tunebench sweep)", severity="warning"
                )
                return
            self.app.push_screen(self.app.make_screen("compare", sweep=name))

    @work(thread=True, group="runs-action")
    def _run_action(self, action: str, run_id: str, arg: str = "") -> None:
        try:
            if action == "cancel":
                run_queue.cancel(run_id)
                text = "cancelled (taken out of the queue)"
            elif action == "resume":
                services.resume_run(run_id)
                text = "resumed"
            elif action == "stop":
                services.stop_run(run_id)
                text = "stop requested"
            elif action == "export":
                text = f"exported to {services.export_run(run_id, arg)}"
            elif action == "delete":
                left = services.delete_run(run_id, remove_files=True)
                text = "deleted" if left is None else f"deleted; {left}"
            elif action == "tag":
                services.set_tags(run_id, arg)
                text = "tags saved"
            else:
                services.set_notes(run_id, arg)
                text = "note saved"
        except Exception as exc:  # shown as a toast; the message names what to change
            self.post_message(RunActionDone(action, str(exc), run_id, ok=False))
            return
        self.post_message(RunActionDone(action, text, run_id))

    def on_work_failed(self, message: WorkFailed) -> None:
        self._status(message.text)

    def on_run_action_done(self, message: RunActionDone) -> None:
        name = self._run_name(message.run_id) if message.run_id else ""
        text = f"{name}: {message.text}" if name else message.text
        self.notify(text, severity="information" if message.ok else "error")
        self.refresh_runs()

    def action_quit_app(self) -> None:
        self.app.exit()
