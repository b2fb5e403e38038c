"""Golden token/label sequences for each prompt template with real tokenizers.

The expected prompt strings are written out here from each template's spec (Alpaca: the prompt of
Stanford Alpaca's train.py, which picks the no-input prompt only for ``input == ""``; the task
templates: torchtune 0.6.1's prompts, checked against torchtune itself in test_torchtune_parity.py);
ids come from the `tokenizers` library encoding the whole text. A token is a prompt token (masked)
when the library's offsets put it wholly inside the prompt text."""

from __future__ import annotations

import pytest

from engine.config import ConfigError
from engine.data import (
    AlpacaInstructTemplate,
    ChatMLTemplate,
    DataError,
    GrammarErrorCorrectionTemplate,
    InputOutputToMessages,
    PromptTemplate,
    QuestionAnswerTemplate,
    StackExchangedPairedTemplate,
    SummarizeTemplate,
    instruct_dataset,
    preference_dataset,
    tokenize_messages,
)
from engine.data.templates import resolve_template

CASES = [
    (
        AlpacaInstructTemplate(),
        {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n### Instruction:\nAdd the numbers.\n\n"
        "### Input:\n2 and 3\n\n### Response:\n",
    ),
    (
        AlpacaInstructTemplate(),
        {"instruction": "Name a colour.", "input": "", "output": "Blue."},
        "Below is an instruction that describes a task. Write a response that appropriately completes the "
        "request.\n\n### Instruction:\nName a colour.\n\n### Response:\n",
    ),
    (  # an input of spaces is an input (Stanford Alpaca tests input != "")
        AlpacaInstructTemplate(),
        {"instruction": "Name a colour.", "input": "  ", "output": "Blue."},
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n### Instruction:\nName a colour.\n\n"
        "### Input:\n  \n\n### Response:\n",
    ),
    (
        GrammarErrorCorrectionTemplate(),
        {"input": "She go home.", "output": "She goes home."},
        "Correct this to standard English: She go home.\n---\nCorrected: ",
    ),
    (
        ChatMLTemplate(),
        {"input": "Say hi.", "output": "Hi!"},
        "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        ChatMLTemplate(system_prompt="Be {brief}."),
        {"input": "Say hi.", "output": "Hi!"},
        "<|im_start|>system\nBe {brief}.<|im_end|>\n<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n",
    ),
    (
        SummarizeTemplate(),
        {"dialogue": "A: hi\nB: hello", "output": "They greet."},
        "Summarize this dialogue:\nA: hi\nB: hello\n---\nSummary:\n",
    ),
    (
        QuestionAnswerTemplate(),
        {"question": "What is 6 * 7?", "output": "6 * 7 = 42.\n#### 42"},
        "Question: What is 6 * 7?\n\nAnswer: ",
    ),
    (
        PromptTemplate("Translate to French: {text}\nFrench: "),
        {"text": "cat", "output": "chat"},
        "Translate to French: cat\nFrench: ",
    ),
]


def _prompt_tokens(ref, prompt: str, body: str) -> int:
    """How many leading tokens of `body` lie wholly inside its first len(prompt) characters."""
    enc = ref.encode(body, add_special_tokens=False)
    return sum(end <= len(prompt) for _, end in enc.offsets)


@pytest.mark.parametrize("name", ["llama3", "mistral7b_v01", "qwen3", "smollm2"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_template_tokens_and_labels(case, name, tok, rust):
    template, row, prompt = CASES[case]
    t, ref = tok(name), rust(name)
    assert template.format(row) == prompt
    msgs = InputOutputToMessages(template)(row)
    ids, mask = tokenize_messages(t, msgs)
    body = ref.encode(prompt + row["output"], add_special_tokens=False).ids
    # A prompt ending in a space ("Corrected: ") merges it into the response's first token (" She"),
    # which is then trained.
    n_prompt = _prompt_tokens(ref, prompt, prompt + row["output"])
    # Mistral and Llama 3 start with BOS (the llama3 tokenizer.json's post-processor adds none, Meta's
    # tokenizer always does); Qwen3 and SmolLM2 (the repo's demo tokenizer) add none.
    bos = {"llama3": [128000], "mistral7b_v01": [1], "qwen3": [], "smollm2": []}[name]
    assert ids == bos + body + [t.eos_id]
    assert mask == [True] * (len(bos) + n_prompt) + [False] * (len(body) - n_prompt + 1)


def test_train_on_input_trains_prompt(tok):
    t = tok("smollm2")
    template, row, _ = CASES[0]
    _, mask = tokenize_messages(t, InputOutputToMessages(template, train_on_input=True)(row))
    assert not any(mask)


def test_stack_exchange_preference_golden(tok, rust):
    t, ref = tok("llama3"), rust("llama3")
    rows = [
        {"question": "Why is the sky blue?", "response_j": "Rayleigh scattering.", "response_k": "Paint."}
    ]
    ds = preference_dataset(
        t,
        source=rows,
        template=StackExchangedPairedTemplate(),
        column_map={"chosen": "response_j", "rejected": "response_k"},
        cache=False,
    )
    prompt = "Question: Why is the sky blue?\n\nAnswer: "
    s = ds[0]
    for side, answer in (("chosen", "Rayleigh scattering."), ("rejected", "Paint.")):
        want = [128000, *ref.encode(prompt + answer, add_special_tokens=False).ids, t.eos_id]
        n = 1 + _prompt_tokens(ref, prompt, prompt + answer)  # BOS + prompt tokens
        assert s[f"{side}_tokens"] == want
        assert s[f"{side}_labels"] == [-100] * (n - 1) + want[n:] + [-100]


def test_dotted_string_and_instance_both_accepted(tok):
    t = tok("smollm2")
    rows = [{"instruction": "Say hi.", "output": "Hi!"}]
    a = instruct_dataset(t, source=rows, template="engine.data.AlpacaInstructTemplate", cache=False)
    b = instruct_dataset(t, source=rows, template=AlpacaInstructTemplate(), cache=False)
    assert a[0] == b[0]
    assert isinstance(resolve_template("AlpacaInstructTemplate"), AlpacaInstructTemplate)


def test_bad_templates():
    with pytest.raises(DataError, match="not a prompt template"):
        resolve_template("engine.data.ChatMLFormat")
    with pytest.raises(DataError, match="name every field"):
        PromptTemplate("Q: {}")
    with pytest.raises(DataError, match="malformed"):
        PromptTemplate("Q: {question")


def test_template_names_resolve_or_explain():
    with pytest.raises(DataError, match="unknown template 'Alpaca'; use one of AlpacaInstructTemplate"):
        resolve_template("Alpaca")
    with pytest.raises(ConfigError, match="not on the allow-list of components"):
        resolve_template("mypkg.templates.Custom")  # other packages go through engine.config's allow-list
