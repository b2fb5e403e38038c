"""Messages and the transforms that turn common dataset row shapes into them.

A transform is a callable ``row (dict) -> list[Message]`` (preference transforms return a
``(chosen, rejected)`` pair of message lists). A transform that cannot read a row raises `RowError`
naming the field; the dataset builders add the source and row number and turn it into a `DataError`
(or skip the row when `skip_bad_rows=True`).

Masking: `Message.masked=True` keeps a message's tokens out of the loss. Transforms mask system and
user turns unless `train_on_input=True`; assistant turns are always trained.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant", "tool", "text")

# ShareGPT speaker names -> roles. The format has no fixed vocabulary; these are the names in use.
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}


class RowError(ValueError):
    """One row cannot be used. `field` is the column at fault; `str()` says what is wrong."""

    def __init__(self, field: str | None, problem: str):
        super().__init__(problem)
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class Message:
    """One turn of a conversation.

    Args:
      role: "system", "user", "assistant", "tool", or "text" (plain text, no chat wrapping).
      content: the text.
      masked: True keeps this turn's tokens out of the loss (labels -100).
    """

    role: str
    content: str
    masked: bool = False

    def __post_init__(self):
        if self.role not in ROLES:
            raise RowError("role", f"unknown role {self.role!r}; use one of {', '.join(ROLES)}")
        if not isinstance(self.content, str):
            raise RowError("content", f"message content is {type(self.content).__name__}, not text")


def apply_column_map(row: Mapping[str, Any], column_map: Mapping[str, str] | None) -> dict[str, Any]:
    """Copy `row` with `column_map` applied: ``{expected_name: actual_column}``.

    `column_map={"output": "summary"}` lets a transform that reads ``output`` read the ``summary``
    column. Raises `RowError` when an actual column is absent.
    """
    out = dict(row)
    for expected, actual in (column_map or {}).items():
        if actual not in row:
            cols = ", ".join(map(str, row)) or "none"
            raise RowError(actual, f"column_map names column {actual!r}, which is absent (columns: {cols})")
        out[expected] = row[actual]
    return out


def get_text(row: Mapping[str, Any], field: str, *, allow_empty: bool = False) -> str:
    """`row[field]` as text; raises `RowError` when it is missing, not text, or empty (unless allowed)."""
    if field not in row:
        cols = ", ".join(map(str, row)) or "none"
        raise RowError(
            field, f"missing column (columns: {cols}); map it with column_map: {{{field}: <your column>}}"
        )
    value = row[field]
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise RowError(field, f"expected text, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise RowError(field, "is empty")
    return value


def _user_masked(train_on_input: bool) -> bool:
    return not train_on_input


class InputOutputToMessages:
    """Row with a prompt and a response -> ``[system?, user, assistant]``.

    Args:
      template: a prompt template (`PromptTemplateInterface`) that builds the user text from the row;
        None: the user text is the ``input`` column as is.
      train_on_input: train on the prompt tokens too (default False: prompt masked).
      system_prompt: optional system message placed first (masked unless `train_on_input`).
    The response is the ``output`` column (rename with `column_map`).
    """

    def __init__(self, template=None, train_on_input: bool = False, system_prompt: str | None = None):
        self.template = template
        self.train_on_input = train_on_input
        self.system_prompt = system_prompt

    def __call__(self, row: Mapping[str, Any]) -> list[Message]:
        prompt = self.template.format(row) if self.template is not None else get_text(row, "input")
        response = get_text(row, "output")
        masked = _user_masked(self.train_on_input)
        msgs = [Message("system", self.system_prompt, masked)] if self.system_prompt else []
        return [*msgs, Message("user", prompt, masked), Message("assistant", response, False)]

    def __repr__(self) -> str:
        return f"InputOutputToMessages({self.template!r}, {self.train_on_input}, {self.system_prompt!r})"


def AlpacaToMessages(train_on_input: bool = False) -> InputOutputToMessages:
    """Alpaca rows (``instruction``, optional ``input``, ``output``) with the Alpaca prompt."""
    from engine.data.templates import AlpacaInstructTemplate

    return InputOutputToMessages(AlpacaInstructTemplate(), train_on_input=train_on_input)


def _check_alternation(msgs: list[Message], field: str) -> list[Message]:
    if not any(m.role == "assistant" for m in msgs):
        raise RowError(field, "conversation has no assistant turn, so nothing to train on")
    return msgs


class ShareGPTToMessages:
    """ShareGPT rows (``conversations: [{"from": "human"|"gpt"|"system", "value": str}, ...]``).

    Args:
      train_on_input: train on user/system turns too.
      system_prompt: system message to prepend when the conversation has none.
    """

    column = "conversations"

    def __init__(self, train_on_input: bool = False, system_prompt: str | None = None):
        self.train_on_input = train_on_input
        self.system_prompt = system_prompt

    def __call__(self, row: Mapping[str, Any]) -> list[Message]:
        turns = row.get(self.column)
        if self.column not in row:
            cols = ", ".join(map(str, row)) or "none"
            raise RowError(self.column, f"missing column (columns: {cols}); map it with column_map")
        if not isinstance(turns, list) or not turns:
            raise RowError(self.column, "is not a conversation (expected a non-empty list of {from, value})")
        msgs: list[Message] = []
        for k, turn in enumerate(turns):
            if not isinstance(turn, Mapping) or "from" not in turn or "value" not in turn:
                raise RowError(self.column, f"turn {k} is not a {{from, value}} object")
            role = SHAREGPT_ROLES.get(str(turn["from"]).lower())
            if role is None:
                raise RowError(self.column, f"turn {k} has unknown speaker {turn['from']!r}")
            masked = role != "assistant" and _user_masked(self.train_on_input)
            msgs.append(Message(role, str(turn["value"] or ""), masked))
        if self.system_prompt and msgs[0].role != "system":
            msgs.insert(0, Message("system", self.system_prompt, _user_masked(self.train_on_input)))
        return _check_alternation(msgs, self.column)

    def __repr__(self) -> str:
        return f"ShareGPTToMessages({self.train_on_input}, {self.system_prompt!r})"


class OpenAIToMessages:
    """OpenAI chat rows (``messages: [{"role": ..., "content": ...}, ...]``).

    Args:
      train_on_input: train on user/system turns too.
      column: the column holding the list (default ``messages``).
    """

    def __init__(self, train_on_input: bool = False, column: str = "messages"):
        self.train_on_input = train_on_input
        self.column = column

    def convert(self, turns: Any, field: str) -> list[Message]:
        if not isinstance(turns, list) or not turns:
            raise RowError(field, "is not a conversation (expected a non-empty list of {role, content})")
        msgs = []
        for k, turn in enumerate(turns):
            if not isinstance(turn, Mapping) or "role" not in turn or "content" not in turn:
                raise RowError(field, f"turn {k} is not a {{role, content}} object")
            role = str(turn["role"])
            if role not in ("system", "user", "assistant", "tool"):
                raise RowError(field, f"turn {k} has unknown role {role!r}")
            masked = role != "assistant" and _user_masked(self.train_on_input)
            msgs.append(Message(role, str(turn["content"] or ""), masked))
        return msgs

    def __call__(self, row: Mapping[str, Any]) -> list[Message]:
        if self.column not in row:
            cols = ", ".join(map(str, row)) or "none"
            raise RowError(self.column, f"missing column (columns: {cols}); map it with column_map")
        return _check_alternation(self.convert(row[self.column], self.column), self.column)

    def __repr__(self) -> str:
        return f"OpenAIToMessages({self.train_on_input}, {self.column!r})"


_HH_TURN = re.compile(r"\n\n(Human|Assistant): ")


def parse_transcript(text: str, field: str) -> list[tuple[str, str]]:
    """Split an Anthropic HH transcript (``"\\n\\nHuman: ...\\n\\nAssistant: ..."``) into (role, text)."""
    pieces = _HH_TURN.split(text)
    if len(pieces) < 3 or pieces[0].strip():
        raise RowError(field, "is not a '\\n\\nHuman: ... \\n\\nAssistant: ...' transcript")
    turns = []
    for speaker, body in zip(pieces[1::2], pieces[2::2]):
        turns.append(("user" if speaker == "Human" else "assistant", body))
    return turns


class ChosenRejectedToMessages:
    """Preference rows -> ``(chosen_messages, rejected_messages)`` sharing one prompt.

    Three row shapes are read:
      - ``chosen`` / ``rejected`` are lists of ``{role, content}`` (OpenAI style, prompt included);
      - ``chosen`` / ``rejected`` are response texts and ``prompt`` is the prompt (formatted by
        `template` when given, e.g. `StackExchangedPairedTemplate` reading ``question``);
      - ``chosen`` / ``rejected`` are whole Anthropic HH transcripts; the last assistant turn is the
        response, the turns before it (which must agree) are the prompt.
    Args:
      template: prompt template for the text-with-prompt shape.
      train_on_input: train on prompt tokens too.
    """

    def __init__(self, template=None, train_on_input: bool = False):
        self.template = template
        self.train_on_input = train_on_input

    def __call__(self, row: Mapping[str, Any]) -> tuple[list[Message], list[Message]]:
        masked = _user_masked(self.train_on_input)
        for field in ("chosen", "rejected"):
            if field not in row:
                cols = ", ".join(map(str, row)) or "none"
                raise RowError(field, f"missing column (columns: {cols}); map it with column_map")
        chosen, rejected = row["chosen"], row["rejected"]
        if isinstance(chosen, list):
            conv = OpenAIToMessages(self.train_on_input)
            return (
                _check_alternation(conv.convert(chosen, "chosen"), "chosen"),
                _check_alternation(conv.convert(rejected, "rejected"), "rejected"),
            )
        if self.template is not None or "prompt" in row:
            prompt = self.template.format(row) if self.template is not None else get_text(row, "prompt")
            user = Message("user", prompt, masked)
            return (
                [user, Message("assistant", get_text(row, "chosen"), False)],
                [user, Message("assistant", get_text(row, "rejected"), False)],
            )
        c_turns = parse_transcript(get_text(row, "chosen"), "chosen")
        r_turns = parse_transcript(get_text(row, "rejected"), "rejected")
        if c_turns[-1][0] != "assistant" or r_turns[-1][0] != "assistant":
            raise RowError("chosen", "transcript does not end with an Assistant turn")
        if c_turns[:-1] != r_turns[:-1]:
            raise RowError("rejected", "transcript's prompt turns differ from the chosen transcript's")

        def to_msgs(turns):
            return [
                Message(r, t, masked if r != "assistant" or i < len(turns) - 1 else False)
                for i, (r, t) in enumerate(turns)
            ]

        return to_msgs(c_turns), to_msgs(r_turns)

    def __repr__(self) -> str:
        return f"ChosenRejectedToMessages({self.template!r}, {self.train_on_input})"


class TextToMessages:
    """Plain-text rows -> one trained ``text`` message (no chat wrapping). Reads `column` (``text``)."""

    def __init__(self, column: str = "text"):
        self.column = column

    def __call__(self, row: Mapping[str, Any]) -> list[Message]:
        return [Message("text", get_text(row, self.column), False)]

    def __repr__(self) -> str:
        return f"TextToMessages({self.column!r})"
