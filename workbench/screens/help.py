"""`?`: the keys of the screen underneath, and what the screen is for."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

GLOBAL_KEYS = [
    ("?", "this help"),
    ("ctrl+p", "command palette (screens, themes, actions)"),
    ("q / escape", "back (quit on the Runs screen; runs keep going)"),
    ("f1 f2 f3 f4", "Runs, Models, Data, Recipe"),
    ("f10", "Playground: chat with the demo model, a run or a model folder"),
    ("ctrl+t", "next theme (dark, light, terminal ANSI colours)"),
]


def screen_keys(screen: Screen) -> list[tuple[str, str]]:
    """(key, action) pairs of a screen's bindings that have a description, in declaration order."""
    out, seen = [], set()
    for binding in getattr(screen, "BINDINGS", []):
        if isinstance(binding, Binding):
            key, desc = binding.key_display or binding.key, binding.description
        else:
            key, desc = binding[0], binding[2] if len(binding) > 2 else binding[1]
        if key in seen or not desc:
            continue
        seen.add(key)
        out.append((key.replace("slash", "/").replace(",", " / "), desc))
    return out


def help_table(screen: Screen) -> Group:
    """The screen's purpose (its docstring's first paragraph) and two compact tables of keys."""
    doc = " ".join((type(screen).__doc__ or "").strip().split("\n\n")[0].split())
    parts: list = [
        Text(getattr(screen, "TITLE", None) or type(screen).__name__, style="bold"),
        Text(doc),
        Text(""),
    ]
    for title, rows in (("this screen", screen_keys(screen)), ("everywhere", GLOBAL_KEYS)):
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for key, desc in rows:
            table.add_row(key, desc)
        parts += [Text(title, style="bold underline"), table, Text("")]
    return Group(*parts)


class HelpScreen(ModalScreen):
    """Help for the screen below; any of `?`, `q`, `escape` closes it."""

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: 80%;
        max-width: 90;
        height: auto;
        max-height: 90%;
        padding: 1 2;
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
            yield Static(help_table(self.under))
