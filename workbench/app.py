"""The tunebench workbench: a Textual app over the run tracker and the launcher.

`run_app()` is what `tunebench` (no subcommand) calls; `make_app(...)` builds the app for tests and
benchmarks. Heavy libraries (torch, datasets, transformers) are never imported here: screens import
engine pieces inside worker threads, so the first frame paints fast.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

THEMES = {"dark": "textual-dark", "light": "textual-light", "ansi": "ansi-dark"}


def refresh_interval() -> float:
    """Seconds between live redraws: 0.5 (2 Hz) locally, 1.0 over SSH (`SSH_CONNECTION` set)."""
    return 1.0 if os.environ.get("SSH_CONNECTION") else 0.5


class TunebenchApp(App):
    """Runs is the home screen; Models, Data, Recipe, Live run, Compare and Playground are pushed on top."""

    TITLE = "tunebench"
    CSS_PATH = Path(__file__).with_name("app.tcss")
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("ctrl+t", "cycle_theme", "theme", show=False),
        Binding("f1", "goto('runs')", "runs", show=False),
        Binding("f2", "goto('models')", "models", show=False),
        Binding("f3", "goto('data')", "data", show=False),
        Binding("f4", "goto('recipe')", "recipe", show=False),
        Binding("f10", "goto('playground')", "playground", show=False),
    ]

    def __init__(
        self,
        *,
        home: Path | str | None = None,
        theme: str | None = None,
        interval: float | None = None,
        recipe_module: str | None = None,
    ) -> None:
        """`home` sets `TUNEBENCH_HOME` for this process; `theme` is dark, light or ansi (default from
        `TUNEBENCH_THEME`, else dark); `interval` overrides the live redraw period in seconds;
        `recipe_module` overrides the module launched for a recipe (tests use a tiny one)."""
        super().__init__()
        if home is not None:
            os.environ["TUNEBENCH_HOME"] = str(home)
        self.interval = interval if interval is not None else refresh_interval()
        self.recipe_module = recipe_module
        name = theme or os.environ.get("TUNEBENCH_THEME", "dark")
        self.theme = THEMES.get(name, name if name in self.available_themes else "textual-dark")
        # Data screen -> Recipe screen: the mix being composed (source nodes, and the `dataset:` node).
        self.dataset_mix: list[dict] = []
        self.dataset_node: dict | None = None

    def get_default_screen(self) -> Screen:
        from workbench.screens.runs_screen import RunsScreen

        return RunsScreen()

    # Navigation -----------------------------------------------------------------------------
    def make_screen(self, name: str, **kwargs) -> Screen:
        """A new screen by name: runs, models, data, recipe, live (run_id=), compare (run_ids= or sweep=),
        samples (run_id=, output_dir=), playground (models=: one or two model specs)."""
        if name == "runs":
            from workbench.screens.runs_screen import RunsScreen

            return RunsScreen()
        if name == "models":
            from workbench.screens.models_screen import ModelsScreen

            return ModelsScreen()
        if name == "data":
            from workbench.screens.data import DataScreen

            return DataScreen()
        if name == "recipe":
            from workbench.screens.recipe import RecipeScreen

            return RecipeScreen(**kwargs)
        if name == "live":
            from workbench.screens.live import LiveRunScreen

            return LiveRunScreen(**kwargs)
        if name == "compare":
            from workbench.screens.compare_screen import CompareScreen

            return CompareScreen(**kwargs)
        if name == "samples":
            from workbench.screens.samples import SamplesScreen

            return SamplesScreen(**kwargs)
        if name == "playground":
            from workbench.screens.playground import PlaygroundScreen

            return PlaygroundScreen(**kwargs)
        raise ValueError(f"unknown screen {name!r}")

    def action_goto(self, name: str) -> None:
        """Show a top-level screen; going to Runs pops back to home."""
        if name == "runs":
            while len(self.screen_stack) > 1:
                self.pop_screen()
            return
        if type(self.screen).__name__.lower().startswith(name):
            return
        self.push_screen(self.make_screen(name))

    def action_help(self) -> None:
        from workbench.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    def action_cycle_theme(self) -> None:
        order = list(THEMES.values())
        i = order.index(self.theme) if self.theme in order else -1
        self.theme = order[(i + 1) % len(order)]
        self.notify(f"theme: {self.theme}", timeout=2)

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for name, text in (
            ("runs", "Runs: the table of runs"),
            ("models", "Models: model cards and local checkpoints"),
            ("data", "Data: compose a dataset mix"),
            ("recipe", "Recipe: configure, validate and launch a run"),
            ("playground", "Playground: chat with a checkpoint or the demo model, two side by side"),
        ):
            yield SystemCommand(f"Go to {name}", text, lambda n=name: self.action_goto(n))
        for label, theme in THEMES.items():
            yield SystemCommand(
                f"Theme: {label}", f"use the {theme} theme", lambda t=theme: setattr(self, "theme", t)
            )


def make_app(
    *,
    home: Path | str | None = None,
    theme: str | None = None,
    interval: float | None = None,
    recipe_module: str | None = None,
) -> TunebenchApp:
    """Build the workbench app (see `TunebenchApp.__init__` for the arguments)."""
    return TunebenchApp(home=home, theme=theme, interval=interval, recipe_module=recipe_module)


def run_app() -> int:
    """Open the workbench in this terminal; returns 0. Quitting never stops a run."""
    make_app().run()
    return 0
