"""Progress of a run: a bar with step/total and an ETA from the recent step rate."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar


def format_eta(seconds: float | None) -> str:
    """`1h02m`, `4m05s`, `12s`, or `--` when unknown."""
    if seconds is None or seconds < 0 or seconds != seconds:
        return "--"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def recent_rate(step_times: list[tuple[int, float]]) -> float | None:
    """Steps per second over the recent `(step, time)` points (the first step's start-up excluded)."""
    if len(step_times) < 2:
        return None
    (s0, t0), (s1, t1) = step_times[0], step_times[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None


def estimate_eta(step: int, total: int | None, elapsed_s: float | None) -> float | None:
    """Seconds left at the average rate so far; None without a total or before the first step."""
    if not total or not elapsed_s or step <= 0 or step >= total:
        return 0.0 if total and step >= total else None
    return elapsed_s / step * (total - step)


class RunProgress(Horizontal):
    """`[#####     ] step 40/100  ETA 1m12s`; call `update_progress(step, total, elapsed_s)`."""

    DEFAULT_CSS = """
    RunProgress {
        height: 1;
    }
    RunProgress ProgressBar {
        width: 1fr;
    }
    RunProgress #progress-text {
        width: auto;
        padding: 0 1;
    }
    """

    def compose(self) -> ComposeResult:
        yield ProgressBar(total=None, show_eta=False, show_percentage=True, id="progress-bar")
        yield Label("step -", id="progress-text")

    def update_progress(
        self, step: int, total: int | None, elapsed_s: float | None, rate: float | None = None
    ) -> None:
        """Show `step`/`total`; the ETA uses `rate` (recent steps per second) when given, else the
        average since the start."""
        bar = self.query_one(ProgressBar)
        bar.update(total=total or None, progress=step)
        if rate and total and step < total:
            eta = format_eta((total - step) / rate)
        else:
            eta = format_eta(estimate_eta(step, total, elapsed_s))
        text = f"step {step}/{total}  ETA {eta}" if total else f"step {step}"
        self.query_one("#progress-text", Label).update(text)
