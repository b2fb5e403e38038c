"""The memory estimate of a configured run beside the detected device memory, with a warning."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from engine.training.memory_estimate import GiB, MemoryEstimate


def render_estimate(
    est: MemoryEstimate, device: str, device_bytes: float | None, measured_peak_gb: float | None = None
) -> Table:
    """A small table: each part in GiB, the total vs the device, and the measured peak when known."""
    table = Table.grid(padding=(0, 1))
    table.add_column(justify="left")
    table.add_column(justify="right")
    for name, gib in est.as_gib().items():
        if name == "total" or (name == "overhead" and not gib):
            continue
        table.add_row(name, f"{gib:.2f} GiB")
    total = est.total_bytes / GiB
    fits = est.fits(device_bytes)
    style = "bold red" if fits is False else "bold green" if fits else "bold"
    table.add_row(Text("total", style="bold"), Text(f"{total:.2f} GiB", style=style))
    if device_bytes:
        table.add_row(device, f"{device_bytes / GiB:.1f} GiB")
    if fits is False:
        table.add_row(
            Text("will not fit", style="bold red"),
            Text("try LoRA/QLoRA, checkpointing, smaller batch", style="red"),
        )
    if measured_peak_gb is not None:
        table.add_row("measured peak", f"{measured_peak_gb:.2f} GiB")
    for note in est.notes:
        table.add_row(Text(note, style="dim"), "")
    return table


class MemoryPanel(Static):
    """Shows an estimate (`show_estimate`) or why there is none (`show_message`)."""

    DEFAULT_CSS = """
    MemoryPanel {
        border: round $panel;
        height: auto;
        padding: 0 1;
    }
    MemoryPanel.-too-big {
        border: round $error;
    }
    """

    last_estimate: MemoryEstimate | None = None

    def on_mount(self) -> None:
        self.border_title = "memory estimate (per rank)"

    def show_estimate(
        self,
        est: MemoryEstimate,
        device: str,
        device_bytes: float | None,
        measured_peak_gb: float | None = None,
    ) -> None:
        self.last_estimate = est
        self.set_class(est.fits(device_bytes) is False, "-too-big")
        self.update(render_estimate(est, device, device_bytes, measured_peak_gb))

    def show_message(self, text: str) -> None:
        self.last_estimate = None
        self.remove_class("-too-big")
        self.update(Text(text, style="italic"))
