"""Presets for well-known datasets. Each points at the Hugging Face Hub; pass `source=` a local copy
(file or folder) to read that instead, and any builder argument to override the defaults, e.g.
``{_component_: engine.data.gsm8k_dataset, source: data/gsm8k_train.jsonl, max_seq_len: 512}``.

| preset                           | Hub source                      | builder / template                              |
|----------------------------------|---------------------------------|-------------------------------------------------|
| alpaca_dataset                   | tatsu-lab/alpaca                | instruct, AlpacaInstructTemplate                |
| alpaca_cleaned_dataset           | yahma/alpaca-cleaned            | instruct, AlpacaInstructTemplate                |
| slimorca_dataset                 | Open-Orca/SlimOrca-Dedup        | chat, ShareGPT conversations                    |
| samsum_dataset                   | Samsung/samsum                  | instruct, SummarizeTemplate, output <- summary  |
| grammar_dataset                  | liweili/c4_200m                 | instruct, GrammarErrorCorrectionTemplate        |
| stack_exchange_paired_dataset    | lvwerra/stack-exchange-paired   | preference, StackExchangedPairedTemplate        |
| hh_rlhf_dataset                  | Anthropic/hh-rlhf               | preference, HH transcripts                      |
| gsm8k_dataset                    | openai/gsm8k (main)             | instruct, QuestionAnswerTemplate, output <- answer |
| wikitext_dataset                 | Salesforce/wikitext (103 raw)   | text completion                                 |
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

from engine.data.builders import chat_dataset, instruct_dataset, preference_dataset, text_completion_dataset
from engine.data.templates import (
    AlpacaInstructTemplate,
    GrammarErrorCorrectionTemplate,
    QuestionAnswerTemplate,
    StackExchangedPairedTemplate,
    SummarizeTemplate,
)


def _signature_of(builder, fixed: tuple[str, ...] = (), **defaults: Any):
    """Give a preset the signature of its builder (without the arguments the preset fixes, with the
    preset's defaults), so `tunebench validate` checks a preset's arguments like the builder's."""

    def wrap(fn):
        hints = typing.get_type_hints(builder)
        params = []
        for name, p in inspect.signature(builder).parameters.items():
            if name in fixed:
                continue
            params.append(p.replace(default=defaults[name]) if name in defaults else p)
        fn.__signature__ = inspect.Signature(params, return_annotation=inspect.Signature.empty)
        fn.__annotations__ = {k: v for k, v in hints.items() if k not in fixed and k != "return"}
        return fn

    return wrap


def _local(source: Any) -> bool:
    from pathlib import Path

    return isinstance(source, (list, tuple)) or Path(str(source)).expanduser().exists()


@_signature_of(
    instruct_dataset,
    source="tatsu-lab/alpaca",
    train_on_input=True,
    name="alpaca",
    template=AlpacaInstructTemplate(),
)
def alpaca_dataset(tokenizer, *, source: Any = "tatsu-lab/alpaca", train_on_input: bool = True, **kwargs):
    """Alpaca (52k instructions). `train_on_input` defaults to True as in the original recipe."""
    kwargs.setdefault("name", "alpaca")
    kwargs.setdefault("template", AlpacaInstructTemplate())
    return instruct_dataset(tokenizer, source=source, train_on_input=train_on_input, **kwargs)


@_signature_of(
    instruct_dataset,
    source="yahma/alpaca-cleaned",
    train_on_input=True,
    name="alpaca_cleaned",
    template=AlpacaInstructTemplate(),
)
def alpaca_cleaned_dataset(
    tokenizer, *, source: Any = "yahma/alpaca-cleaned", train_on_input: bool = True, **kwargs
):
    """Alpaca-cleaned (51.8k instructions with the original's errors fixed)."""
    kwargs.setdefault("name", "alpaca_cleaned")
    kwargs.setdefault("template", AlpacaInstructTemplate())
    return instruct_dataset(tokenizer, source=source, train_on_input=train_on_input, **kwargs)


@_signature_of(chat_dataset, ("conversation_style",), source="Open-Orca/SlimOrca-Dedup", name="slimorca")
def slimorca_dataset(tokenizer, *, source: Any = "Open-Orca/SlimOrca-Dedup", **kwargs):
    """SlimOrca (ShareGPT-style GPT-4 conversations with system prompts)."""
    kwargs.setdefault("name", "slimorca")
    return chat_dataset(tokenizer, source=source, conversation_style="sharegpt", **kwargs)


@_signature_of(
    instruct_dataset,
    source="Samsung/samsum",
    name="samsum",
    column_map={"output": "summary"},
    template=SummarizeTemplate(),
)
def samsum_dataset(tokenizer, *, source: Any = "Samsung/samsum", **kwargs):
    """SAMSum dialogue summaries (``dialogue`` -> ``summary``)."""
    kwargs.setdefault("name", "samsum")
    kwargs.setdefault("template", SummarizeTemplate())
    kwargs.setdefault("column_map", {"output": "summary"})
    return instruct_dataset(tokenizer, source=source, **kwargs)


@_signature_of(
    instruct_dataset, source="liweili/c4_200m", name="grammar", template=GrammarErrorCorrectionTemplate()
)
def grammar_dataset(tokenizer, *, source: Any = "liweili/c4_200m", **kwargs):
    """C4-200M grammar correction pairs (``input`` -> ``output``)."""
    kwargs.setdefault("name", "grammar")
    kwargs.setdefault("template", GrammarErrorCorrectionTemplate())
    return instruct_dataset(tokenizer, source=source, **kwargs)


@_signature_of(
    preference_dataset,
    source="lvwerra/stack-exchange-paired",
    name="stack_exchange_paired",
    column_map={"chosen": "response_j", "rejected": "response_k"},
    template=StackExchangedPairedTemplate(),
)
def stack_exchange_paired_dataset(tokenizer, *, source: Any = "lvwerra/stack-exchange-paired", **kwargs):
    """Stack Exchange preference pairs (``question``; ``response_j`` preferred over ``response_k``)."""
    kwargs.setdefault("name", "stack_exchange_paired")
    kwargs.setdefault("template", StackExchangedPairedTemplate())
    kwargs.setdefault("column_map", {"chosen": "response_j", "rejected": "response_k"})
    return preference_dataset(tokenizer, source=source, **kwargs)


@_signature_of(preference_dataset, source="Anthropic/hh-rlhf", name="hh_rlhf")
def hh_rlhf_dataset(tokenizer, *, source: Any = "Anthropic/hh-rlhf", **kwargs):
    """Anthropic HH-RLHF (``chosen``/``rejected`` Human/Assistant transcripts)."""
    kwargs.setdefault("name", "hh_rlhf")
    return preference_dataset(tokenizer, source=source, **kwargs)


@_signature_of(
    instruct_dataset,
    source="openai/gsm8k",
    subset="main",
    name="gsm8k",
    column_map={"output": "answer"},
    template=QuestionAnswerTemplate(),
)
def gsm8k_dataset(tokenizer, *, source: Any = "openai/gsm8k", subset: str | None = "main", **kwargs):
    """GSM8K grade-school maths (``question`` -> ``answer`` ending in ``#### N``)."""
    kwargs.setdefault("name", "gsm8k")
    kwargs.setdefault("template", QuestionAnswerTemplate())
    kwargs.setdefault("column_map", {"output": "answer"})
    subset = None if _local(source) else subset
    return instruct_dataset(tokenizer, source=source, subset=subset, **kwargs)


@_signature_of(
    text_completion_dataset, (), source="Salesforce/wikitext", subset="wikitext-103-raw-v1", name="wikitext"
)
def wikitext_dataset(
    tokenizer, *, source: Any = "Salesforce/wikitext", subset: str | None = "wikitext-103-raw-v1", **kwargs
):
    """WikiText-103 raw text for continued pre-training (blank lines dropped; pack it)."""
    kwargs.setdefault("name", "wikitext")
    subset = None if _local(source) else subset
    return text_completion_dataset(tokenizer, source=source, subset=subset, **kwargs)
