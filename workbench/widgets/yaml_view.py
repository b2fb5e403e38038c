"""A read-only, syntax-highlighted, scrollable view of a YAML document."""

from __future__ import annotations

from rich.syntax import Syntax
from textual.containers import VerticalScroll
from textual.widgets import Static


class YamlView(VerticalScroll):
    """Shows `text` as highlighted YAML; `set_text` replaces it."""

    DEFAULT_CSS = """
    YamlView {
        border: round $panel;
        height: 1fr;
    }
    YamlView > Static {
        width: auto;
    }
    """

    def __init__(self, text: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.text = text
        self.border_title = "config.yaml"

    def compose(self):
        yield Static(self._render_text(), id="yaml-body")

    def _render_text(self):
        return Syntax(self.text or "# (empty)", "yaml", theme="ansi_dark", background_color="default")

    def set_text(self, text: str) -> None:
        self.text = text
        if self.is_mounted:
            self.query_one("#yaml-body", Static).update(self._render_text())
