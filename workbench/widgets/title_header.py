"""The screens' title bar: Textual's `Header` (same look), whose title is set when it changes, not later.

Textual's `Header` sets its title from a coroutine that its Mount handler queues on the app and on the
screen. When the screen went away before that coroutine ran (a screen popped right after it was pushed,
the app closed right after a screen change), the Header's title child was already removed and the
coroutine failed with `NoMatches: No nodes match 'HeaderTitle' on Header()`, which stops the app (it
failed a workbench test under load: the test closed the app as soon as the Live run screen showed).
`TitleHeader` handles Mount itself, `prevent_default` keeping the base handlers from running (Header's
and Widget's; Widget's only shows scroll bars, which a header has none of), and sets the title inside
the watchers, at once: there is nothing left to run after the screen is gone.
"""

from __future__ import annotations

from textual.dom import NoScreen
from textual.events import Mount
from textual.widgets import Header


class TitleHeader(Header):
    """`textual.widgets.Header` whose title follows the app's and the screen's `title` and `sub_title`
    synchronously (see the module docstring). Same arguments as `Header`."""

    def on_mount(self, event: Mount) -> None:
        event.prevent_default()
        for owner in (self.app, self.screen):
            for name in ("title", "sub_title"):
                self.watch(owner, name, self._show_title)  # init=True: shows the title now

    def _show_title(self) -> None:
        """Write the formatted title into the title child; nothing once the children are gone."""
        try:
            for title in self.query("HeaderTitle"):
                title.update(self.format_title())
        except NoScreen:  # the header was detached from its screen meanwhile
            pass
