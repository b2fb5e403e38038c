"""Small modal dialogs: yes/no confirmation, typed confirmation, one line of text input, and a
choice among a few options."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

_CSS = """
{name} {{
    align: center middle;
}}
{name} > Vertical {{
    width: 64;
    height: auto;
    border: thick $warning;
    background: $surface;
    padding: 1 2;
}}
{name} Horizontal {{
    height: auto;
    align-horizontal: right;
}}
{name} Button {{
    margin-left: 1;
}}
"""


class ConfirmScreen(ModalScreen[bool]):
    """Ask a yes/no question; dismisses with True for yes (`y`), False for no (`n`/`escape`)."""

    DEFAULT_CSS = _CSS.format(name="ConfirmScreen")
    BINDINGS = [Binding("y", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question)
            with Horizontal():
                yield Button("No", id="no")
                yield Button("Yes", id="yes", variant="error")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class TypedConfirmScreen(ModalScreen[bool]):
    """Destructive action: the user must type `expected` (e.g. the run name) and press enter."""

    DEFAULT_CSS = _CSS.format(name="TypedConfirmScreen")
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, question: str, expected: str) -> None:
        super().__init__()
        self.question = question
        self.expected = expected

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question)
            yield Label(f"Type [b]{self.expected}[/b] and press enter to confirm, escape to cancel.")
            yield Input(placeholder=self.expected, id="typed")

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        if event.value.strip() == self.expected:
            self.dismiss(True)
        else:
            self.notify(f"typed text does not match {self.expected!r}", severity="warning")

    def action_cancel(self) -> None:
        self.dismiss(False)


class TextPromptScreen(ModalScreen[str | None]):
    """One line of text (a tag list, a note, a file path); enter returns it, escape returns None."""

    DEFAULT_CSS = _CSS.format(name="TextPromptScreen")
    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, prompt: str, value: str = "") -> None:
        super().__init__()
        self.prompt = prompt
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.prompt)
            yield Input(value=self.value, id="text")

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ChoiceScreen(ModalScreen[str | None]):
    """Pick one of a few `choices` (e.g. a GGUF storage type): its button, or its number key (1-9);
    escape returns None."""

    DEFAULT_CSS = _CSS.format(name="ChoiceScreen")
    BINDINGS = [Binding("escape", "cancel", "cancel")] + [
        Binding(str(n), f"pick({n - 1})", show=False) for n in range(1, 10)
    ]

    def __init__(self, prompt: str, choices: list[str] | tuple[str, ...]) -> None:
        super().__init__()
        self.prompt = prompt
        self.choices = list(choices)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.prompt)
            with Horizontal():
                for i, choice in enumerate(self.choices):
                    yield Button(
                        f"{i + 1} {choice}", id=f"choice-{i}", variant="primary" if i == 0 else "default"
                    )

    def on_mount(self) -> None:
        self.query_one("#choice-0", Button).focus()

    def action_pick(self, index: int) -> None:
        if index < len(self.choices):
            self.dismiss(self.choices[index])

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(self.choices[int(str(event.button.id).removeprefix("choice-"))])

    def action_cancel(self) -> None:
        self.dismiss(None)
