"""`?`: the keys of the screen underneath, and what the screen is for."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Markdown

GLOBAL_KEYS = [
    ("?", "this help"),
    ("ctrl+p", "command palette (screens, themes, actions)"),
    ("q / escape", "back (quit on the Runs screen; runs keep going)"),
    ("f1 f2 f3 f4", "Runs, Models, Data, Recipe"),
    ("ctrl+t", "next theme (dark, light, terminal ANSI colours)"),
]


def help_markdown(screen: Screen) -> str:
    """Markdown: the screen's purpose (its docstring's first paragraph) and its key bindings."""
    doc = (type(screen).__doc__ or "").strip().split("\n\n")[0]
    lines = [
        f"# {getattr(screen, 'TITLE', None) or type(screen).__name__}",
        "",
        doc,
        "",
        "| key | action |",
        "|---|---|",
    ]
    seen = set()
    for binding in getattr(screen, "BINDINGS", []):
        if isinstance(binding, Binding):
            key, desc = binding.key_display or binding.key, binding.description
        else:
            key, desc = binding[0], binding[2] if len(binding) > 2 else binding[1]
        if key in seen or not desc:
            continue
        seen.add(key)
        lines.append(f"| `{key}` | {desc} |")
    lines += ["", "## everywhere", "", "| key | action |", "|---|---|"]
    lines += [f"| `{k}` | {d} |" for k, d in GLOBAL_KEYS]
    return "\n".join(lines)


class HelpScreen(ModalScreen):
    """Help for the screen below; any of `?`, `q`, `escape` closes it."""

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: 80%;
        max-width: 90;
        height: 80%;
        border: thick $primary;
        background: $surface;
    }
    """
    BINDINGS = [
        Binding("escape,q,question_mark", "dismiss", "close", key_display="esc"),
    ]

    def __init__(self, under: Screen) -> None:
        super().__init__()
        self.under = under

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(help_markdown(self.under))
