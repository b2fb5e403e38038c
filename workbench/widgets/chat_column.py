"""One model's conversation in the Playground: the model's name as the title, the turns, the reply
growing as its pieces arrive, and a status line (loading, ready, the last reply's speed, errors).

The column keeps the conversation (`messages`, the user/assistant turns the next prompt is built
from) but never the model: the screen owns that, so leaving the screen frees it.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Label, Static


class ChatColumn(Vertical):
    """A transcript and a status line; call `add_user`, `begin_reply`, `append_reply`, `end_reply`."""

    DEFAULT_CSS = """
    ChatColumn {
        width: 1fr;
        height: 1fr;
        border: round $panel;
    }
    ChatColumn:focus-within {
        border: round $accent;
    }
    ChatColumn > VerticalScroll {
        height: 1fr;
        padding: 0 1;
    }
    ChatColumn .chat-user {
        color: $text-accent;
        text-style: bold;
        margin-top: 1;
    }
    ChatColumn .chat-model {
        color: $text;
    }
    ChatColumn .chat-error {
        color: $text-error;
    }
    ChatColumn > .chat-status {
        height: 1;
        padding: 0 1;
        color: $text-muted;
    }
    """

    def __init__(self, title: str = "no model", **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = title
        self.messages: list[dict[str, str]] = []
        self.reply = ""  # the reply being streamed (or the last one)
        self.streaming = False
        self.status = ""
        self._reply_view: Static | None = None

    def compose(self) -> ComposeResult:
        yield VerticalScroll()
        yield Label("", classes="chat-status")

    # Title and status ------------------------------------------------------------------------
    def set_title(self, title: str) -> None:
        self.border_title = title

    def set_status(self, text: str) -> None:
        self.status = text
        self.query_one(".chat-status", Label).update(Text(text))

    # Turns -----------------------------------------------------------------------------------
    def _add(self, text: str, css: str) -> Static:
        view = Static(Text(text), classes=css)
        scroll = self.query_one(VerticalScroll)
        scroll.mount(view)
        scroll.scroll_end(animate=False)
        return view

    def add_user(self, text: str) -> None:
        """Show the user's message and add it to the conversation."""
        self.messages.append({"role": "user", "content": text})
        self._add(f"> {text}", "chat-user")

    def begin_reply(self) -> None:
        """Start an empty reply that `append_reply` grows."""
        self.reply, self.streaming = "", True
        self._reply_view = self._add("…", "chat-model")
        self.set_status("generating…")

    def append_reply(self, piece: str) -> None:
        if self._reply_view is None:
            return
        self.reply += piece
        self._reply_view.update(Text(self.reply))
        self.query_one(VerticalScroll).scroll_end(animate=False)

    def end_reply(self, text: str, summary: str) -> None:
        """The reply ended: show its exact full `text` and add it to the conversation."""
        self.reply, self.streaming = text, False
        if self._reply_view is not None:
            self._reply_view.update(Text(text))
        self._reply_view = None
        self.messages.append({"role": "assistant", "content": text})
        self.set_status(summary)

    def fail_reply(self, text: str) -> None:
        """The reply could not be generated: drop the user's turn from the conversation, show why."""
        self.streaming = False
        if self._reply_view is not None:
            self._reply_view.remove()
            self._reply_view = None
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()
        self._add(text, "chat-error")
        self.set_status(text)

    def clear(self) -> None:
        """Forget the conversation (a new chat with the same model)."""
        self.messages, self.reply, self.streaming, self._reply_view = [], "", False, None
        self.query_one(VerticalScroll).remove_children()
