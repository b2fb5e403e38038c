"""One rendered training sample: tokens the loss ignores are dimmed, trained-on tokens are bright."""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual.widgets import Static


def render_segments(segments: Iterable[tuple[str, bool]]) -> Text:
    """`(text, masked)` pairs -> a rich Text with masked spans dimmed and trained spans bold."""
    out = Text()
    for text, masked in segments:
        out.append(text, style="dim" if masked else "bold")
    return out


class SamplePreview(Static):
    """Call `show(segments)` with `(text, masked)` pairs, or `show_message(text)`."""

    DEFAULT_CSS = """
    SamplePreview {
        border: round $panel;
        height: 1fr;
        padding: 0 1;
        overflow-y: auto;
    }
    """

    def on_mount(self) -> None:
        self.border_title = "preview (dim = masked from the loss)"

    def show(self, segments: Iterable[tuple[str, bool]]) -> None:
        self.update(render_segments(segments))

    def show_message(self, text: str) -> None:
        self.update(Text(text, style="italic"))
