"""Prompt templates: the text a model sees before the response, built from a row's columns.

Every template is a component usable from YAML, either as a dotted string
(``template: engine.data.AlpacaInstructTemplate``) or as a node
(``template: {_component_: engine.data.PromptTemplate, template: "Q: {question}\\nA: "}``).
Templates read named fields of the row (after `column_map`); a missing or empty field raises
`RowError` naming it. The response itself is the ``output`` column (or ``chosen``/``rejected`` for
preference data), not part of the template.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from engine.data.data_errors import DataError
from engine.data.messages import Message, RowError, get_text


@runtime_checkable
class PromptTemplateInterface(Protocol):
    """What the instruct/preference builders need from a template.

    `fields`: the row columns the template reads. `format(row) -> str`: the prompt text.
    `__call__(messages, inference=False) -> list[Message]`: the same template applied to a conversation,
    as torchtune's `PromptTemplateInterface` is (each user turn's text put into the template; the
    messages' texts back to back are then `format`'s prompt followed by the answer).
    """

    fields: tuple[str, ...]

    def format(self, row: Mapping[str, Any]) -> str: ...

    def __call__(self, messages: list[Message], inference: bool = False) -> list[Message]: ...


def template_fields(template: str) -> tuple[str, ...]:
    """The ``{name}`` fields of a `str.format` template, in order, without repeats.

    Raises `DataError` for a malformed template or positional fields (``{}``, ``{0}``).
    """
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise DataError(
            f"template {template!r} is malformed ({exc}); escape literal braces as {{{{ }}}}"
        ) from None
    names: list[str] = []
    for _, name, _, _ in parsed:
        if name is None:
            continue
        if name == "" or name.isdigit() or not name.isidentifier():
            raise DataError(f"template {template!r} has field {{{name}}}; name every field after a column")
        if name not in names:
            names.append(name)
    return tuple(names)


class InstructTemplate:
    """A prompt from a `str.format` template over row columns.

    Args:
      template: text with ``{column}`` fields, e.g. ``"Question: {question}\\nAnswer: "``.
      optional: fields that may be missing or empty (filled with "").
    Raises `DataError` when the template is malformed; `format` raises `RowError` for a missing field.
    """

    def __init__(self, template: str, optional: tuple[str, ...] | list[str] = ()):
        self.template = template
        self.fields = template_fields(template)
        self.optional = tuple(optional)

    def format(self, row: Mapping[str, Any]) -> str:
        values = {}
        for f in self.fields:
            if f in self.optional:
                values[f] = get_text(row, f, allow_empty=True) if f in row else ""
            else:
                values[f] = get_text(row, f)
        return self.template.format(**values)

    @property
    def message_field(self) -> str:
        """The field a user turn's text fills when the template is called on messages: the only
        required field (or, with none required, the first field).

        Raises:
            DataError: the template reads two or more required fields (one turn cannot fill them).
        """
        required = [f for f in self.fields if f not in self.optional]
        if len(required) > 1:
            raise DataError(
                f"{self!r} reads {', '.join(required)}: a user message fills one field; "
                "call format(row) with every field instead"
            )
        if not required and not self.fields:
            raise DataError(f"{self!r} reads no field: there is nowhere to put a user message")
        return required[0] if required else self.fields[0]

    def __call__(self, messages: list[Message], inference: bool = False) -> list[Message]:
        """torchtune's `PromptTemplateInterface`: every user message's text put into the template
        (`format({message_field: text})`); other messages as they are (new `Message`s, masks kept).
        `inference` is accepted for the interface: a plain template adds no assistant header."""
        field = self.message_field if any(m.role == "user" for m in messages) else None
        return [
            dataclasses.replace(m, content=self.format({field: m.content})) if m.role == "user" else m
            for m in messages
        ]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.template!r})"


class PromptTemplate(InstructTemplate):
    """A user-defined template from YAML: ``{_component_: engine.data.PromptTemplate, template: "..."}``.

    Same as `InstructTemplate`; kept as the name users write. `check_columns` reports a field the data
    does not have before any row is tokenized.
    """

    def check_columns(self, columns: list[str], source: str) -> None:
        """Raise `DataError` when the template names a field absent from `columns`."""
        for f in self.fields:
            if f not in columns and f not in self.optional:
                raise DataError(
                    f"source {source!r}: template field {{{f}}} is not a column (columns: {', '.join(columns)}); "
                    f"fix the template or add column_map: {{{f}: <your column>}}"
                )


# The prompt of Stanford Alpaca (github.com/tatsu-lab/stanford_alpaca, train.py PROMPT_DICT).
ALPACA_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)


class AlpacaInstructTemplate(InstructTemplate):
    """The Alpaca prompt: reads ``instruction`` and (optional) ``input``; picks the no-input variant
    when ``input`` is missing or empty, as Stanford Alpaca does (``input != ""``; an input of spaces
    keeps the input prompt)."""

    def __init__(self):
        super().__init__(ALPACA_WITH_INPUT, optional=("input",))

    @property
    def message_field(self) -> str:
        """A user message is the instruction (the no-input prompt)."""
        return "instruction"

    def format(self, row: Mapping[str, Any]) -> str:
        instruction = get_text(row, "instruction")
        extra = row.get("input") or ""
        if not isinstance(extra, str):
            raise RowError("input", f"expected text, got {type(extra).__name__}")
        if extra != "":
            return ALPACA_WITH_INPUT.format(instruction=instruction, input=extra)
        return ALPACA_NO_INPUT.format(instruction=instruction)


class GrammarErrorCorrectionTemplate(InstructTemplate):
    """Grammar correction (e.g. C4-200M ``input`` -> ``output``): reads ``input``; torchtune's
    prompt ``Correct this to standard English: {input}\\n---\\nCorrected: ``."""

    def __init__(self):
        super().__init__("Correct this to standard English: {input}\n---\nCorrected: ")


class ChatMLTemplate(InstructTemplate):
    """A ChatML prompt as text, for models trained on ChatML without a chat format (plain layout):
    ``[<|im_start|>system\\n{system}<|im_end|>\\n]<|im_start|>user\\n{input}<|im_end|>\\n<|im_start|>assistant\\n``,
    the text torchtune's ``ChatMLTemplate`` writes around a user turn and an (empty) assistant turn.
    The response then follows, and the plain layout's EOS ends it (``<|im_end|>`` for Qwen).
    Reads ``input``; `system_prompt` adds a system turn.
    """

    def __init__(self, system_prompt: str | None = None):
        self.system_prompt = system_prompt
        system = "" if system_prompt is None else f"<|im_start|>system\n{_literal(system_prompt)}<|im_end|>\n"
        super().__init__(system + "<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n")

    def __call__(self, messages: list[Message], inference: bool = False) -> list[Message]:
        """Each message wrapped in its ChatML turn, as torchtune's `ChatMLTemplate` does: system and
        user ``<|im_start|>{role}\n{text}<|im_end|>\n``, assistant ``<|im_start|>assistant\n{text}``
        (the plain layout's EOS ends the answer, as with `format`); `system_prompt` first unless the
        conversation has its own system turn; `inference` with no assistant turn last adds the empty
        assistant header to generate from. The texts back to back are `format`'s prompt + the answer."""
        messages = list(messages)
        if self.system_prompt is not None and not (messages and messages[0].role == "system"):
            messages.insert(0, Message("system", self.system_prompt, masked=True))
        out = []
        for m in messages:
            if m.role == "assistant":
                out.append(dataclasses.replace(m, content=f"<|im_start|>assistant\n{m.content}"))
            else:
                out.append(dataclasses.replace(m, content=f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n"))
        if inference and (not out or out[-1].role != "assistant"):
            out.append(Message("assistant", "<|im_start|>assistant\n", masked=True))
        return out

    def __repr__(self) -> str:
        return f"ChatMLTemplate({self.system_prompt!r})"


def _literal(text: str) -> str:
    """`text` with braces escaped, so `str.format` leaves it as is."""
    return text.replace("{", "{{").replace("}", "}}")


class SummarizeTemplate(InstructTemplate):
    """Dialogue summarisation (e.g. SAMSum ``dialogue`` -> ``summary``): reads ``dialogue``."""

    def __init__(self):
        super().__init__("Summarize this dialogue:\n{dialogue}\n---\nSummary:\n")


class QuestionAnswerTemplate(InstructTemplate):
    """Question answering (e.g. GSM8K ``question`` -> ``answer``): reads ``question``."""

    def __init__(self):
        super().__init__("Question: {question}\n\nAnswer: ")


class StackExchangedPairedTemplate(InstructTemplate):
    """Stack Exchange preference pairs (``question``, ``response_j`` preferred, ``response_k``):
    reads ``question``."""

    def __init__(self):
        super().__init__("Question: {question}\n\nAnswer: ")


def resolve_template(template: Any) -> PromptTemplateInterface | None:
    """A template instance from an instance, a dotted name, or a plain template string.

    - ``None`` -> ``None``.
    - ``"engine.data.AlpacaInstructTemplate"`` (a dotted name) -> that class, instantiated. Names under
      ``engine.data`` resolve here; any other dotted name goes through `engine.config`'s allow-list.
    - any other string containing ``{`` -> `PromptTemplate(template)`.
    Raises `DataError` for a name that is not a template.
    """
    if template is None or isinstance(template, PromptTemplateInterface):
        return template
    if not isinstance(template, str):
        raise DataError(
            f"template: got {type(template).__name__}; give a dotted name like engine.data.AlpacaInstructTemplate "
            "or a {_component_: engine.data.PromptTemplate, template: '...'} node"
        )
    if "{" in template:
        return PromptTemplate(template)
    import engine.data as data_pkg

    name = template.removeprefix("engine.data.")
    obj = getattr(data_pkg, name, None) if "." not in name else None
    if obj is None:
        obj = _import_allowed(template)
    if isinstance(obj, type):
        obj = obj()
    if not isinstance(obj, PromptTemplateInterface):
        known = _template_names()
        raise DataError(f"template: {template!r} is not a prompt template; use one of {known}")
    return obj


def _template_names() -> str:
    import engine.data as data_pkg

    return ", ".join(
        n
        for n in dir(data_pkg)
        if isinstance(getattr(data_pkg, n), type) and issubclass(getattr(data_pkg, n), InstructTemplate)
    )


def _import_allowed(dotted: str) -> Any:
    """A template class named outside engine.data, imported through engine.config's allow-list."""
    if "." not in dotted:
        raise DataError(
            f"template: unknown template {dotted!r}; use one of {_template_names()}, or a '...{{column}}...' string"
        )
    from engine.config import import_component

    return import_component(dotted, field="template")
