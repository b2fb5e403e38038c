"""Playground: chat with a checkpoint (a run's latest or chosen one, a model folder, the demo model),
or with two side by side, the same message going to both and the answers streaming in two columns.

Models load in worker threads; replies come from the native KV-cache generation
(`engine.generation.batched_generate`) in one worker thread per column, which posts the text as it grows
(`ReplyChunk`), then `ReplyDone` or `ReplyFailed`; nothing in a thread touches a widget. The stop key
sets a flag the generation loop reads after every token (`should_stop`): the reply ends there. The
screen holds the only references to the models; leaving it drops them and collects the garbage, so
their memory is freed.
"""

from __future__ import annotations

import gc
import sys
import threading

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Input

from workbench.chat_models import SPEC_HELP, SamplingSettings, load_chat_model, one_line, resolve_chat_source
from workbench.errors import UserError
from workbench.screens.confirm import TextPromptScreen
from workbench.ui_messages import ChatModelFailed, ChatModelLoaded, ReplyChunk, ReplyDone, ReplyFailed
from workbench.widgets.chat_column import ChatColumn
from workbench.widgets.sampling_controls import SamplingControls
from workbench.widgets.title_header import TitleHeader

COLUMNS = 2


class PlaygroundScreen(Screen):
    """Playground: chat with a checkpoint, a model folder or the demo model; with two models the same
    message goes to both and their answers stream side by side.

    A model is: demo, a model folder, a checkpoint or run folder, a run id or name (its latest
    checkpoint), RUN@STEP (that checkpoint) or RUN@base (the model the run started from). Leaving the
    screen frees the models' memory.
    """

    TITLE = "Playground"
    BINDINGS = [
        Binding("ctrl+s", "stop", "stop"),
        Binding("ctrl+l", "choose(0)", "left model"),
        Binding("ctrl+r", "choose(1)", "right model"),
        Binding("ctrl+n", "new_chat", "new chat"),
        Binding("escape", "back", "stop / back", key_display="esc"),
    ]
    DEFAULT_CSS = """
    PlaygroundScreen #chat-columns {
        height: 1fr;
    }
    PlaygroundScreen #prompt {
        height: 3;
    }
    """

    def __init__(self, models: list[str] | None = None) -> None:
        """`models`: one or two model specs (default: the demo model)."""
        super().__init__()
        given = [str(m).strip() for m in models or ["demo"]][:COLUMNS]
        self.specs: list[str | None] = (given + [None] * COLUMNS)[:COLUMNS]
        # The loaded models, by column: the only references the app holds to them.
        self.models: dict[int, object] = {}
        self._stop = threading.Event()

    def compose(self) -> ComposeResult:
        yield TitleHeader()
        with Horizontal(id="chat-columns"):
            for i in range(COLUMNS):
                yield ChatColumn(id=f"chat-{i}")
        yield SamplingControls(id="sampling")
        yield Input(placeholder="message: enter sends it to every model", id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        for i, spec in enumerate(self.specs):
            self.column(i).display = spec is not None
            if spec is not None:
                self._start_load(i, spec)
        self.query_one("#prompt", Input).focus()

    def column(self, i: int) -> ChatColumn:
        return self.query_one(f"#chat-{i}", ChatColumn)

    @property
    def streaming(self) -> bool:
        return any(self.column(i).streaming for i in range(COLUMNS))

    # Models ----------------------------------------------------------------------------------
    def _drop_model(self, i: int) -> None:
        if self.models.pop(i, None) is not None:
            gc.collect()
            _empty_device_cache()

    def _start_load(self, i: int, spec: str) -> None:
        self._drop_model(i)  # the old model goes before the new one loads: never two in memory
        col = self.column(i)
        col.display = True
        col.clear()
        col.set_title(spec)
        col.set_status(f"loading {spec}…")
        self.specs[i] = spec
        self.load_model(i, spec)

    @work(thread=True, group="playground-load")
    def load_model(self, column: int, spec: str) -> None:
        try:
            chat = load_chat_model(resolve_chat_source(spec))
        except Exception as exc:  # a bad spec or folder: one line in the column and a toast
            self.post_message(ChatModelFailed(column, one_line(exc)))
            return
        self.post_message(ChatModelLoaded(column, chat))

    def on_chat_model_loaded(self, message: ChatModelLoaded) -> None:
        chat = message.model
        if self.specs[message.column] != chat.source.spec:
            return  # another model was chosen for this column while this one loaded
        self.models[message.column] = chat
        col = self.column(message.column)
        col.set_title(chat.label)
        where = "chat template" if chat.chat else "no chat template: plain continuation"
        col.set_status(f"ready · {where} · {chat.device}")

    def on_chat_model_failed(self, message: ChatModelFailed) -> None:
        self.column(message.column).set_status(message.text)
        self.notify(message.text, severity="error")

    def action_choose(self, i: int) -> None:
        if self.streaming:
            self.notify("a reply is streaming; ctrl+s stops it", severity="warning")
            return

        def chosen(spec: str | None) -> None:
            if spec is None:
                return
            spec = spec.strip()
            if not spec and i > 0:  # an empty right model closes that column
                self._drop_model(i)
                self.specs[i] = None
                self.column(i).display = False
                return
            if spec:
                self._start_load(i, spec)

        side = "left" if i == 0 else "right (empty: one column)"
        current = self.specs[i] or (f"{self.specs[0]}@base" if self.specs[0] not in (None, "demo") else "")
        self.app.push_screen(TextPromptScreen(f"Model for the {side}: {SPEC_HELP}", current), chosen)

    # Chat ------------------------------------------------------------------------------------
    @on(Input.Submitted, "#prompt")
    def _send(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if self.streaming:
            self.notify("a reply is still streaming; ctrl+s stops it", severity="warning")
            return
        try:
            settings = self.query_one(SamplingControls).settings()
        except UserError as exc:
            self.notify(str(exc), severity="error")
            return
        ready = [i for i in range(COLUMNS) if i in self.models]
        if not ready:
            self.notify("no model loaded yet (wait for it, or ctrl+l opens one)", severity="warning")
            return
        event.input.value = ""
        self._stop = threading.Event()
        for i in ready:
            col = self.column(i)
            col.add_user(text)
            col.begin_reply()
            self.generate_reply(i, self.models, list(col.messages), settings, self._stop)

    @work(thread=True, group="playground-reply")
    def generate_reply(
        self,
        column: int,
        models: dict[int, object],
        messages: list[dict[str, str]],
        settings: SamplingSettings,
        stop: threading.Event,
    ) -> None:
        # The worker gets the screen's model table, not the model: a finished worker (which Textual
        # may keep a while, e.g. in a message to the popped screen) then holds no model alive.
        chat = models.get(column)
        if chat is None:
            return

        def piece(text: str) -> None:
            self.post_message(ReplyChunk(column, text))

        try:
            reply = chat.reply(messages, settings, on_text=piece, should_stop=stop.is_set)
        except Exception as exc:  # a prompt too long for the context, a model that fails: one line
            self.post_message(ReplyFailed(column, one_line(exc)))
            return
        self.post_message(ReplyDone(column, reply.text, reply.summary()))

    def on_reply_chunk(self, message: ReplyChunk) -> None:
        self.column(message.column).append_reply(message.text)

    def on_reply_done(self, message: ReplyDone) -> None:
        self.column(message.column).end_reply(message.text, message.summary)

    def on_reply_failed(self, message: ReplyFailed) -> None:
        self.column(message.column).fail_reply(message.text)
        self.notify(message.text, severity="error")

    def action_stop(self) -> None:
        if self.streaming:
            self._stop.set()

    def action_new_chat(self) -> None:
        if self.streaming:
            self.notify("a reply is streaming; ctrl+s stops it", severity="warning")
            return
        for i in range(COLUMNS):
            self.column(i).clear()

    def action_back(self) -> None:
        """escape: stop a streaming reply; when none streams, leave the screen."""
        if self.streaming:
            self._stop.set()
            return
        self.app.pop_screen()

    def on_unmount(self) -> None:
        self._stop.set()  # a reply still running ends at its next token and lets go of its model
        self.models.clear()
        gc.collect()
        _empty_device_cache()


def _empty_device_cache() -> None:
    """Return freed GPU memory to the device (when torch was loaded and a GPU is in use)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
