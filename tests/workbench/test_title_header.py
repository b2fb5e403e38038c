"""The screens' title bar (workbench.widgets.title_header): a screen popped, or the app closed, right
after a screen with a header was pushed no longer fails with `NoMatches: No nodes match 'HeaderTitle'`
(Textual's Header did, 10 times in 10: its title update was still queued when its children were
removed), and the title still follows the app's title and the screen's sub-title."""

from __future__ import annotations

import re
from pathlib import Path

from textual.app import App
from textual.screen import Screen
from textual.widgets import Label

from workbench.widgets.title_header import TitleHeader

from .pilot_wait import wait_for

SCREENS = Path(__file__).resolve().parents[2] / "workbench" / "screens"


class _Titled(Screen):
    def compose(self):
        yield TitleHeader()
        yield Label("body")


class _App(App):
    TITLE = "tunebench"

    def get_default_screen(self) -> Screen:
        return _Titled()


async def _push_then_close(pop: bool) -> _App:
    """Push a titled screen, pop it at once when `pop`, and close the app as soon as that shows."""
    app = _App()
    async with app.run_test() as pilot:
        app.push_screen(_Titled())
        await wait_for(pilot, lambda: len(app.screen_stack) == 2, what="the pushed screen")
        if pop:
            app.pop_screen()
            await wait_for(pilot, lambda: len(app.screen_stack) == 1, what="the pop")
            await pilot.pause()  # the work queued by the pop runs before the app closes
    return app


async def test_popping_a_screen_as_soon_as_it_shows_is_safe():
    for _ in range(5):
        assert (await _push_then_close(pop=True)).return_code in (None, 0)


async def test_closing_the_app_as_soon_as_a_screen_shows_is_safe():
    for _ in range(5):
        assert (await _push_then_close(pop=False)).return_code in (None, 0)


async def test_the_title_follows_the_app_title_and_the_screen_sub_title():
    app = _App()
    async with app.run_test() as pilot:
        title = app.screen.query_one("HeaderTitle")
        await wait_for(pilot, lambda: str(title.render()) == "tunebench", what=lambda: str(title.render()))
        app.screen.sub_title = "run-1"
        await wait_for(
            pilot, lambda: str(title.render()) == "tunebench — run-1", what=lambda: str(title.render())
        )
        app.title = "tb"
        await wait_for(pilot, lambda: str(title.render()) == "tb — run-1", what=lambda: str(title.render()))


def test_every_screen_uses_the_title_header():
    plain = [p.name for p in sorted(SCREENS.glob("*.py")) if re.search(r"\byield Header\(", p.read_text())]
    assert not plain, f"use workbench.widgets.title_header.TitleHeader, not textual's Header, in {plain}"
