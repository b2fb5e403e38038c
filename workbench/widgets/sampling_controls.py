"""The Playground's sampling controls: temperature, top-p and max new tokens, read as one
`SamplingSettings` when a message is sent."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Input, Label

from workbench.chat_models import SamplingSettings, parse_settings

DEFAULTS = SamplingSettings()


class SamplingControls(Horizontal):
    """`temperature [0] top-p [1] max tokens [256]`; `settings()` raises `UserError` naming a bad one."""

    DEFAULT_CSS = """
    SamplingControls {
        height: 3;
    }
    SamplingControls Label {
        padding: 1 1 0 1;
        width: auto;
    }
    SamplingControls Input {
        width: 10;
    }
    """

    def compose(self) -> ComposeResult:
        yield Label("temperature")
        yield Input(f"{DEFAULTS.temperature:g}", id="temperature")
        yield Label("top-p")
        yield Input("1", id="top-p")
        yield Label("max tokens")
        yield Input(str(DEFAULTS.max_new_tokens), id="max-tokens")

    def settings(self) -> SamplingSettings:
        return parse_settings(
            self.query_one("#temperature", Input).value,
            self.query_one("#top-p", Input).value,
            self.query_one("#max-tokens", Input).value,
        )

    def set_values(
        self, *, temperature: str | None = None, top_p: str | None = None, max_tokens: str | None = None
    ) -> None:
        """Set controls by text (what typing them would do)."""
        for wid, value in (("#temperature", temperature), ("#top-p", top_p), ("#max-tokens", max_tokens)):
            if value is not None:
                self.query_one(wid, Input).value = value
