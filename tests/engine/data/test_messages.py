"""Row transforms -> messages: each row shape, masking, column_map and the errors they raise."""

from __future__ import annotations

import pytest

from engine.data import (
    AlpacaToMessages,
    ChosenRejectedToMessages,
    InputOutputToMessages,
    Message,
    OpenAIToMessages,
    RowError,
    ShareGPTToMessages,
    TextToMessages,
    apply_column_map,
)


def test_alpaca_and_input_output():
    msgs = AlpacaToMessages()({"instruction": "Add.", "input": "1, 2", "output": "3"})
    assert [m.role for m in msgs] == ["user", "assistant"] and msgs[0].masked and not msgs[1].masked
    assert "### Input:\n1, 2" in msgs[0].content and msgs[1].content == "3"
    msgs = InputOutputToMessages(train_on_input=True, system_prompt="Be exact.")(
        {"input": "q", "output": "a"}
    )
    assert msgs == [
        Message("system", "Be exact.", False),
        Message("user", "q", False),
        Message("assistant", "a", False),
    ]


def test_sharegpt_roles_and_system():
    row = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    msgs = ShareGPTToMessages(system_prompt="S")(row)
    assert [(m.role, m.masked) for m in msgs] == [("system", True), ("user", True), ("assistant", False)]
    with pytest.raises(RowError, match="unknown speaker 'robot'"):
        ShareGPTToMessages()({"conversations": [{"from": "robot", "value": "x"}]})
    with pytest.raises(RowError, match="no assistant turn"):
        ShareGPTToMessages()({"conversations": [{"from": "human", "value": "x"}]})


def test_openai_messages():
    row = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    assert OpenAIToMessages(train_on_input=True)(row)[0].masked is False
    with pytest.raises(RowError) as e:
        OpenAIToMessages()({"messages": [{"role": "wizard", "content": "a"}]})
    assert e.value.field == "messages"


def test_chosen_rejected_hh_transcript():
    row = {
        "chosen": "\n\nHuman: Hi\n\nAssistant: Hello.\n\nHuman: Joke?\n\nAssistant: Knock knock.",
        "rejected": "\n\nHuman: Hi\n\nAssistant: Hello.\n\nHuman: Joke?\n\nAssistant: No.",
    }
    chosen, rejected = ChosenRejectedToMessages()(row)
    assert [m.role for m in chosen] == ["user", "assistant", "user", "assistant"]
    assert [m.masked for m in chosen] == [True, True, True, False]
    assert (
        chosen[-1].content == "Knock knock."
        and rejected[-1].content == "No."
        and chosen[:-1] == rejected[:-1]
    )
    with pytest.raises(RowError, match="prompt turns differ"):
        ChosenRejectedToMessages()(
            {"chosen": row["chosen"], "rejected": "\n\nHuman: Other\n\nAssistant: No."}
        )
    with pytest.raises(RowError, match="transcript"):
        ChosenRejectedToMessages()({"chosen": "plain text", "rejected": "plain text"})


def test_text_and_column_map():
    assert TextToMessages("body")({"body": "once upon"}) == [Message("text", "once upon", False)]
    row = apply_column_map({"q": "x", "summary": "y"}, {"output": "summary"})
    assert row["output"] == "y" and row["q"] == "x"
    with pytest.raises(RowError, match="column_map names column 'nope'"):
        apply_column_map({"a": 1}, {"output": "nope"})
    with pytest.raises(RowError, match="unknown role"):
        Message("narrator", "x")
