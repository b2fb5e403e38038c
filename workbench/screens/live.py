"""Live run: loss, learning rate, tokens/s and memory per rank as they arrive, progress with ETA,
the log tail, and toasts for NaN, out-of-memory, checkpoints and the end of the run.

Recipe panels appear when the recipe logs them: rewards and KL (DPO rewards/margins, GRPO reward,
KL and clip fraction), loss terms (KD's `loss/kd` and `loss/ce`, loss per data source), and GRPO's
rollout statistics (completion length, staleness, dropped rollouts, actor restarts). `s` opens the
GRPO sample completions (`samples.jsonl`); `g` exports the latest checkpoint's merged model as GGUF. Evaluation scores (`tunebench eval`) show as a table
of task/metric by step when the run has any.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.screen import Screen
from textual.widgets import Footer, Label

from workbench import services
from workbench.commands.export_model import TYPES as GGUF_TYPES
from workbench.run_poller import RunPoller
from workbench.screens.confirm import ChoiceScreen, ConfirmScreen
from workbench.ui_messages import ModelExported, RunActionDone, RunDataArrived, WorkFailed
from workbench.widgets.eval_table import EvalTable
from workbench.widgets.log_tail import LogTail
from workbench.widgets.metric_plot import MetricPlot
from workbench.widgets.run_progress import RunProgress
from workbench.widgets.title_header import TitleHeader

# Plot id -> (title, metric names drawn in it; per-rank metrics get one curve per rank)
PLOTS = {
    "loss": ("loss", ("loss",)),
    "lr": ("learning rate", ("lr",)),
    "tps": ("tokens/s", ("tokens_per_sec",)),
    "mem": ("memory GB (per rank)", ("mem_peak_gb",)),
}
# Recipe panel id -> (title, metric name prefixes); a panel is mounted when its first metric arrives.
RECIPE_PANELS = {
    "recipe": ("rewards / KL", ("rewards/", "reward", "kl", "margin", "logps/", "clip_fraction")),
    "terms": ("loss terms", ("loss/",)),
    "rollout": ("GRPO rollouts", ("completion_length", "staleness", "buffer_dropped", "actor_restarts")),
}
TOAST_EVENTS = {
    "nan": ("error", "loss is NaN"),
    "oom": ("error", "out of memory"),
    "checkpoint": ("information", "checkpoint saved"),
    "end": ("information", "run ended"),
    "eval": ("information", "evaluation"),
}
ENDED = ("completed", "failed", "stopped")


def recipe_panel(name: str) -> str | None:
    """The recipe panel id a metric is drawn in (see `RECIPE_PANELS`), or None (standard plots)."""
    if name == "loss":
        return None
    for pid, (_, prefixes) in RECIPE_PANELS.items():
        if name.startswith(prefixes):
            return pid
    return None


class LiveRunScreen(Screen):
    """Live run: curves, progress, log and toasts of one run while it trains (or after it ended)."""

    TITLE = "Live run"
    BINDINGS = [
        Binding("x", "stop", "stop"),
        Binding("r", "resume", "resume"),
        Binding("k", "clone", "clone"),
        Binding("s", "samples", "samples"),
        Binding("g", "export_gguf", "export GGUF"),
        Binding("q,escape", "back", "back"),
    ]
    DEFAULT_CSS = """
    LiveRunScreen #plots {
        grid-size: 2;
        grid-gutter: 0 1;
        height: 1fr;
    }
    LiveRunScreen #plots.-with-recipe {
        grid-size: 3;
    }
    LiveRunScreen.-short LogTail {
        height: 4;
    }
    LiveRunScreen #run-title {
        height: 1;
        padding: 0 1;
        text-style: bold;
    }
    """

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.run: dict[str, Any] = {}
        # metric name -> rank -> (steps, values)
        self.series: dict[str, dict[int, tuple[list[int], list[float]]]] = defaultdict(dict)
        self.poller = RunPoller(run_id)  # the poll worker's cursors (it touches no screen state)
        self._last_status: str | None = None
        self._recipe_panels: set[str] = set()  # recipe panel ids mounted so far
        self._caught_up = False  # False until the first poll (history) has been shown
        self._step_times: deque[tuple[int, float]] = deque(maxlen=30)  # recent (step, time) for the ETA

    def compose(self) -> ComposeResult:
        yield TitleHeader()
        yield Label(f"run {self.run_id}", id="run-title")
        yield RunProgress()
        with Grid(id="plots"):
            for pid, (title, _) in PLOTS.items():
                yield MetricPlot(title, id=f"plot-{pid}")
        yield EvalTable(id="evals")
        yield LogTail()
        yield Footer()

    def on_resize(self) -> None:
        # 80x24 and other short terminals: a shorter log leaves the plots room for their curves.
        self.set_class(self.size.height < 34, "-short")

    def on_mount(self) -> None:
        self.poll()
        self.set_interval(self.app.interval, self.poll)

    # Polling --------------------------------------------------------------------------------
    def poll(self) -> None:
        self._poll(self.poller)

    @work(thread=True, group="live-poll")
    def _poll(self, poller: RunPoller) -> None:
        try:
            data = poller.poll()
        except Exception as exc:
            self.post_message(WorkFailed("poll", f"cannot read run {poller.run_id}: {exc}"))
            return
        if data is not None:
            self.post_message(data)

    def on_run_data_arrived(self, message: RunDataArrived) -> None:
        self.run = message.run
        self._step_times.extend(message.step_times)
        for name, ranks in message.metrics.items():
            for rank, points in ranks.items():
                xs, ys = self.series[name].setdefault(rank, ([], []))
                xs.extend(p[0] for p in points)
                ys.extend(p[1] for p in points)
        self._update_header()
        if message.metrics:
            self._replot(set(message.metrics))
        self.query_one(LogTail).append_text(message.log_text)
        if message.evals is not None:
            self.query_one(EvalTable).show_steps(message.evals)
        for event in message.events if self._caught_up else ():  # no toasts for history
            severity, label = TOAST_EVENTS.get(event["kind"], (None, None))
            if severity:
                self.notify(f"{label}: {event['text']}", severity=severity, timeout=6)
        status = self.run.get("status")
        if self._last_status not in (None, status) and status in ENDED:
            error = self.run.get("error")
            self.notify(
                f"run {self.run.get('name')} {status}" + (f": {error.splitlines()[-1]}" if error else ""),
                severity="error" if status == "failed" else "information",
                timeout=8,
            )
        self._last_status = status
        self._caught_up = True

    def _update_header(self) -> None:
        run = self.run
        started = run.get("started_at")
        end = run.get("ended_at") or time.time()
        elapsed = (end - started) if started else None
        self.query_one("#run-title", Label).update(
            f"{run.get('name')}  [{run.get('status')}]  {run.get('recipe')}  {run.get('model') or ''}"
            f"  x{run.get('nproc', 1)}"
        )
        self.sub_title = str(run.get("name"))
        self.query_one(RunProgress).update_progress(
            int(run.get("step") or 0), run.get("total_steps"), elapsed
        )

    def _curves(self, names: tuple[str, ...]) -> dict[str, tuple[list[int], list[float]]]:
        curves = {}
        for name in names:
            ranks = self.series.get(name, {})
            for rank, xy in sorted(ranks.items()):
                curves[f"{name} r{rank}" if len(ranks) > 1 or rank else name] = xy
        return curves

    def _replot(self, changed: set[str]) -> None:
        for pid, (_, names) in PLOTS.items():
            if changed & set(names):
                self.query_one(f"#plot-{pid}", MetricPlot).set_series(self._curves(names))
        panels: dict[str, list[str]] = defaultdict(list)
        for name in sorted(self.series):
            pid = recipe_panel(name)
            if pid:
                panels[pid].append(name)
        new_panels = [pid for pid in RECIPE_PANELS if pid in panels and pid not in self._recipe_panels]
        if new_panels:
            grid = self.query_one("#plots")
            grid.add_class("-with-recipe")
            for pid in new_panels:
                self._recipe_panels.add(pid)
                grid.mount(MetricPlot(RECIPE_PANELS[pid][0], id=f"plot-{pid}"))
            # Draw every recipe panel once the new ones have a size.
            self.call_after_refresh(self._replot, {n for names in panels.values() for n in names})
            return
        for pid, names in panels.items():
            if changed & set(names):
                self.query_one(f"#plot-{pid}", MetricPlot).set_series(self._curves(tuple(names)))

    # Actions --------------------------------------------------------------------------------
    def action_back(self) -> None:
        self.app.pop_screen()

    def action_stop(self) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self._act("stop")

        self.app.push_screen(ConfirmScreen(f"Stop {self.run.get('name', self.run_id)}?"), answered)

    def action_resume(self) -> None:
        self._act("resume")

    def action_samples(self) -> None:
        self.app.push_screen(
            self.app.make_screen("samples", run_id=self.run_id, output_dir=self.run.get("output_dir"))
        )

    def action_clone(self) -> None:
        self.app.push_screen(self.app.make_screen("recipe", clone_of=self.run_id))

    def action_export_gguf(self) -> None:
        name = self.run.get("name", self.run_id)

        def chosen(qtype: str | None) -> None:
            if qtype:
                self.notify(f"exporting the latest checkpoint as {qtype} GGUF ...")
                self._export_gguf(self.run_id, qtype)

        self.app.push_screen(
            ChoiceScreen(f"Export {name}'s merged model as GGUF (llama.cpp, Ollama); storage:", GGUF_TYPES),
            chosen,
        )

    @work(thread=True, group="gguf-export")
    def _export_gguf(self, run_id: str, qtype: str) -> None:
        from workbench.commands.export_model import export_run_gguf_message

        self.post_message(export_run_gguf_message(run_id, qtype))

    def on_model_exported(self, message: ModelExported) -> None:
        if message.error:
            self.notify(f"GGUF export failed: {message.error}", severity="error", timeout=10)
        else:
            self.notify(f"wrote {message.path}", timeout=10)

    def _act(self, action: str) -> None:
        if action != "stop":  # resume truncates metrics past the checkpoint: re-read the curves from scratch
            self._step_times.clear()
            self.series.clear()
            self.query_one(LogTail).clear()
        self._run_action(action, self.run_id, self.poller)

    @work(thread=True, group="live-action")
    def _run_action(self, action: str, run_id: str, poller: RunPoller) -> None:
        try:
            if action == "stop":
                services.stop_run(run_id)
            else:
                poller.reset()  # waits for a poll in flight, off the UI thread
                services.resume_run(run_id)
        except Exception as exc:
            self.post_message(RunActionDone(action, str(exc), run_id, ok=False))
            return
        self.post_message(RunActionDone(action, "stop requested" if action == "stop" else "resumed", run_id))

    def on_run_action_done(self, message: RunActionDone) -> None:
        self.notify(message.text, severity="information" if message.ok else "error")

    def on_work_failed(self, message: WorkFailed) -> None:
        self.notify(message.text, severity="error")
