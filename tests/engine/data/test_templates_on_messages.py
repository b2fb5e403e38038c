"""Every seed prompt template is callable on a conversation as torchtune's `PromptTemplateInterface` is
(`template(messages, inference=False) -> list[Message]`), and renders the text its `format(row)` renders:
the returned messages' texts back to back are the prompt `format` writes followed by the answer; roles
and masks are kept, and the input list is not changed."""

from __future__ import annotations

import inspect

import pytest

import engine.data.templates as templates
from engine.data.data_errors import DataError
from engine.data.messages import Message

SEEDS = sorted(
    (obj for _, obj in inspect.getmembers(templates, inspect.isclass)
     if issubclass(obj, templates.InstructTemplate) and obj.__module__ == templates.__name__),
    key=lambda c: c.__name__,
)  # fmt: skip


def _build(cls):
    if cls in (templates.InstructTemplate, templates.PromptTemplate):
        return cls("Q: {question} {hint}\nA: ", optional=("hint",))
    return cls()


def test_every_seed_template_is_listed():
    names = {c.__name__ for c in SEEDS}
    assert {"ChatMLTemplate", "AlpacaInstructTemplate", "PromptTemplate", "QuestionAnswerTemplate"} <= names


@pytest.mark.parametrize("cls", SEEDS, ids=lambda c: c.__name__)
def test_called_on_messages_renders_what_format_renders(cls):
    template = _build(cls)
    assert isinstance(template, templates.PromptTemplateInterface)
    text, answer = "What is {2 + 2}?", "4"  # braces: the text is data, never a format string
    messages = [Message("user", text, masked=True), Message("assistant", answer)]
    out = template(messages)
    assert [m.role for m in out] == ["user", "assistant"] and [m.masked for m in out] == [True, False]
    assert "".join(m.content for m in out) == template.format({template.message_field: text}) + answer
    assert messages[0].content == text  # not changed in place


def test_alpaca_user_turn_is_the_instruction_without_input():
    out = templates.AlpacaInstructTemplate()([Message("user", "Add 2 and 2.")])
    assert out[0].content == templates.ALPACA_NO_INPUT.format(instruction="Add 2 and 2.")


def test_chatml_on_messages_as_torchtune_lays_it_out():
    t = templates.ChatMLTemplate(system_prompt="Be brief.")
    out = t([Message("user", "hi", masked=True)], inference=True)
    assert [(m.role, m.content) for m in out] == [
        ("system", "<|im_start|>system\nBe brief.<|im_end|>\n"),
        ("user", "<|im_start|>user\nhi<|im_end|>\n"),
        ("assistant", "<|im_start|>assistant\n"),  # the header to generate from
    ]
    assert "".join(m.content for m in out) == t.format({"input": "hi"})
    own = t([Message("system", "Own."), Message("user", "hi"), Message("assistant", "yo")])
    assert own[0].content == "<|im_start|>system\nOwn.<|im_end|>\n" and len(own) == 3  # no second system
    assert "".join(m.content for m in templates.ChatMLTemplate()([Message("user", "hi")])) == (
        "<|im_start|>user\nhi<|im_end|>\n"
    )


def test_a_template_of_two_required_fields_says_so():
    t = templates.PromptTemplate("{a} and {b}")
    with pytest.raises(DataError, match="reads a, b: a user message fills one field"):
        t([Message("user", "x")])
    assert t([Message("assistant", "only")])[0].content == "only"  # no user turn: nothing to fill
