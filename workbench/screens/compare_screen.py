"""Compare: two or more runs' curves overlaid by step, a summary table (final and best loss,
median tokens/s, peak memory beside the memory estimate, wall time), their evaluation scores (latest
value of each task/metric and its step, when `tunebench eval` recorded any) and their config
differences grouped as model, data mix, recipe, memory options and hyperparameters. Opened on a sweep
(`sweep=`), its runs come ranked best first by final validation loss or an evaluation score
(`workbench.sweeps.rank_sweep`), with the rank and the score as the summary's first columns.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from workbench import services
from workbench.config_diff import config_diff
from workbench.ui_messages import CompareLoaded, WorkFailed
from workbench.widgets.eval_table import EvalTable
from workbench.widgets.metric_plot import MetricPlot
from workbench.widgets.runs_table import format_duration
from workbench.widgets.title_header import TitleHeader

METRICS = ("loss", "lr", "tokens_per_sec", "mem_peak_gb", "grad_norm")
NO_CURVE: tuple = ((), ())  # a run without this metric (one object, so cached frames match)


def as_arrays(series: dict[str, tuple[list, list]]) -> dict[str, tuple[Any, Any]]:
    """Curves as numpy arrays (done once in the loading worker, so redraws never convert lists)."""
    import numpy as np

    return {
        k: (np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64))
        for k, (xs, ys) in series.items()
    }


def summarize(run: dict[str, Any], series: dict[str, tuple[Any, Any]]) -> dict[str, Any]:
    """Final and best loss, median tokens/s, peak memory and wall time of one run (NaN ignored)."""
    import numpy as np

    def finite(name: str):
        values = np.asarray(series.get(name, ([], []))[1], dtype=np.float64)
        return values[np.isfinite(values)]

    loss, tps, mem = finite("loss"), finite("tokens_per_sec"), finite("mem_peak_gb")
    started, ended = run.get("started_at"), run.get("ended_at")
    return {
        "final_loss": float(loss[-1]) if loss.size else None,
        "best_loss": float(loss.min()) if loss.size else None,
        "tokens_per_sec": float(np.median(tps)) if tps.size else None,
        "mem_peak_gb": float(mem.max()) if mem.size else None,
        "wall_s": (ended - started) if started and ended else None,
    }


def _estimate_gb(run: dict[str, Any]) -> float | None:
    """The memory estimate of a run's config in GiB (beside its measured peak), or None."""
    import yaml

    from engine.training.memory_estimate import GiB

    try:
        cfg = yaml.safe_load(run.get("config_text") or "") or {}
        return (
            services.estimate_config(cfg, int(run.get("nproc") or 1), recipe=run.get("recipe")).total_bytes
            / GiB
        )
    except Exception:  # no card for this model, or a config the estimate does not cover
        return None


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


class CompareScreen(Screen):
    """Compare: overlaid curves, a summary table and a config diff of the marked runs."""

    TITLE = "Compare"
    BINDINGS = [
        Binding("m", "next_metric", "metric"),
        Binding("a", "chat", "chat with two"),
        Binding("q,escape", "back", "back"),
    ]
    DEFAULT_CSS = """
    CompareScreen #compare-top {
        height: 1fr;
    }
    CompareScreen #summary {
        height: auto;
        max-height: 8;
    }
    CompareScreen #diff-box {
        height: 1fr;
        border: round $panel;
    }
    """

    def __init__(self, run_ids: list[str] = (), *, sweep: str | None = None) -> None:
        """`run_ids`: the runs to compare; `sweep`: a sweep's name instead (its runs, ranked)."""
        super().__init__()
        self.run_ids = list(run_ids)
        self.sweep = sweep
        self.ranking: dict[str, Any] | None = None
        self.runs: dict[str, dict[str, Any]] = {}
        # run id -> metric name -> (steps, values) of rank 0
        self.data: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
        self.metric = "loss"
        self.evals: dict[str, list[dict[str, Any]]] = {}  # run id -> eval rows (step, task, metric, value)

    def compose(self) -> ComposeResult:
        yield TitleHeader()
        with Horizontal(id="compare-top"):
            yield MetricPlot("loss", id="compare-plot")
        yield DataTable(id="summary", cursor_type="none")
        yield EvalTable(id="evals")
        with VerticalScroll(id="diff-box"):
            yield Static("loading...", id="diff")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#diff-box").border_title = "config diff"
        if self.sweep:
            self.sub_title = f"sweep {self.sweep}"
        self.load(list(self.run_ids), self.sweep)

    @work(thread=True, exclusive=True, group="compare-load")
    def load(self, run_ids: list[str], sweep: str | None = None) -> None:
        runs, data, evals = {}, {}, {}
        ranking = None
        try:
            if sweep:
                from workbench.sweeps import ranking_rows

                ranking = ranking_rows(sweep)
                run_ids = [row["id"] for row in ranking["rows"]]
            for rid in run_ids:
                run, metrics, _ = services.poll_run(rid, after_metric=0, after_event=0)
                series: dict[str, tuple[list[int], list[float]]] = {}
                for m in metrics:
                    if m.rank == 0 or m.name == "mem_peak_gb":
                        xs, ys = series.setdefault(m.name, ([], []))
                        xs.append(m.step)
                        ys.append(m.value)
                runs[rid], data[rid] = run, as_arrays(series)
                run["estimate_gb"] = _estimate_gb(run)
                evals[rid] = services.eval_rows(rid)
        except Exception as exc:
            self.post_message(WorkFailed("compare", f"cannot read runs: {exc}"))
            return
        self.post_message(CompareLoaded(runs, data, evals, ranking=ranking))

    def on_compare_loaded(self, message: CompareLoaded) -> None:
        if message.ranking is not None:
            self.ranking = message.ranking
            self.run_ids = [row["id"] for row in message.ranking["rows"]]
        self.show(message.runs, message.data, message.evals)

    def show(
        self,
        runs: dict[str, dict[str, Any]],
        data: dict[str, dict[str, tuple[list, list]]],
        evals: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        """Fill the plot, the summary and evaluation tables and the diff (also used by the benchmark)."""
        self.runs, self.data, self.evals = runs, data, evals or {}
        self.query_one(EvalTable).show_runs(
            {str(runs[rid].get("name")): self.evals.get(rid, []) for rid in self.run_ids if rid in runs}
        )
        self.redraw_plot()
        table = self.query_one("#summary", DataTable)
        table.clear(columns=True)
        ranked = {row["id"]: row for row in (self.ranking or {}).get("rows", [])}
        if self.ranking is not None:
            better = "higher" if self.ranking["higher_is_better"] else "lower"
            table.add_columns("rank", f"{self.ranking['by']} ({better} is better)")
        table.add_columns(
            "run",
            "status",
            "final loss",
            "best loss",
            "tok/s (median)",
            "peak GB",
            "estimate GB",
            "wall time",
        )
        for rid in self.run_ids:
            run = runs[rid]
            s = summarize(run, data[rid])
            lead = []
            if self.ranking is not None:
                row = ranked.get(rid, {})
                lead = [str(row.get("place") or "-"), _fmt(row.get("score"), ".4g")]
            table.add_row(
                *lead,
                str(run.get("name")),
                str(run.get("status")),
                _fmt(s["final_loss"], ".4f"),
                _fmt(s["best_loss"], ".4f"),
                _fmt(s["tokens_per_sec"], ",.0f"),
                _fmt(s["mem_peak_gb"], ".2f"),
                _fmt(run.get("estimate_gb"), ".2f"),
                format_duration(s["wall_s"]),
            )
        self.query_one("#diff", Static).update(self._diff_table())

    def _diff_table(self):
        import yaml

        configs = []
        for rid in self.run_ids:
            try:
                configs.append(yaml.safe_load(self.runs[rid].get("config_text") or "") or {})
            except yaml.YAMLError:
                configs.append({})
        diff = config_diff(configs)
        if not diff:
            return "the configs are identical"
        table = Table(box=None, expand=True, show_edge=False)
        table.add_column("setting", style="bold")
        for rid in self.run_ids:
            table.add_column(str(self.runs[rid].get("name")))
        for group, rows in diff.items():
            table.add_row(f"[reverse] {group} [/reverse]", *[""] * len(self.run_ids))
            for key, values in rows:
                table.add_row(key, *values)
        return table

    def curves(self, metric: str) -> dict[str, tuple[Any, Any]]:
        """Run name -> (steps, values) of `metric`; the same objects on every call (the plot's
        caches know curves by identity)."""
        return {
            str(self.runs[rid].get("name")): self.data[rid].get(metric, NO_CURVE)
            for rid in self.run_ids
            if rid in self.data
        }

    def redraw_plot(self) -> None:
        """Show the current metric; the frames of the others are prepared in the plot's worker."""
        plot = self.query_one("#compare-plot", MetricPlot)
        plot.border_title = self.metric
        plot.set_series(self.curves(self.metric))
        others = [self.curves(m) for m in METRICS if m != self.metric]
        self.call_after_refresh(plot.prepare, others)  # once the layout (and so the plot's size) settled

    def action_next_metric(self) -> None:
        self.metric = METRICS[(METRICS.index(self.metric) + 1) % len(METRICS)]
        self.redraw_plot()

    def action_chat(self) -> None:
        """The Playground with the first two compared runs side by side."""
        self.app.push_screen(self.app.make_screen("playground", models=self.run_ids[:2]))

    def action_back(self) -> None:
        self.app.pop_screen()

    def on_work_failed(self, message: WorkFailed) -> None:
        self.notify(message.text, severity="error")
        self.query_one("#diff", Static).update(message.text)
