"""Prompt datasets for generation-time training (GRPO) and evaluation: each sample is a prompt ready
for `engine.generation.generate` plus the row's reference answer for the reward.

A sample is ``{"prompt_tokens": list[int], "answer": str, "source_id": int}``; the prompt ends with the
chat format's assistant header (or, plain, with the template's text), so generation starts the answer.
For GSM8K-style answers compare ``extract_answer(completion)`` with ``extract_answer(sample["answer"])``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from engine.data.chat_formats import ChatFormat, resolve_chat_format
from engine.data.data_errors import DataError
from engine.data.dataset import OneSourceDataset, default_name, run_rows
from engine.data.messages import Message, RowError, get_text
from engine.data.sources import load_rows
from engine.data.templates import resolve_template
from engine.data.tokenize import tokenize_prompt


class _PromptConvert:
    """Row -> (prompt ids, answer text)."""

    def __init__(
        self, tokenizer, template, chat_format: ChatFormat, system_prompt, answer_column, max_prompt_len
    ):
        self.tokenizer, self.template, self.chat_format = tokenizer, template, chat_format
        self.system_prompt, self.answer_column, self.max_prompt_len = (
            system_prompt,
            answer_column,
            max_prompt_len,
        )

    def __call__(self, row: Mapping[str, Any]) -> tuple[list[int], str]:
        text = self.template.format(row) if self.template is not None else get_text(row, "input")
        msgs = [Message("system", self.system_prompt, True)] if self.system_prompt else []
        msgs.append(Message("user", text, True))
        ids = tokenize_prompt(self.tokenizer, msgs, self.chat_format)
        if self.max_prompt_len is not None and len(ids) > self.max_prompt_len:
            raise RowError("prompt", f"has {len(ids)} tokens, more than max_prompt_len={self.max_prompt_len}")
        return ids, get_text(row, self.answer_column, allow_empty=True)


class PromptDataset(OneSourceDataset):
    """Prompts and reference answers of one source (see the module docstring)."""

    kind = "prompt"

    def __init__(self, items: list[tuple[list[int], str]], *, name: str, pad_id: int, report):
        super().__init__(name=name, pad_id=pad_id, report=report)
        self._prompts = [np.asarray(ids, dtype=np.int32) for ids, _ in items]
        self._answers = [a for _, a in items]

    def __len__(self) -> int:
        return len(self._prompts)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "prompt_tokens": self._prompts[i].tolist(),
            "answer": self._answers[i],
            "source_id": self.source_id,
        }

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(p) for p in self._prompts], dtype=np.int64)


def prompt_dataset(
    tokenizer,
    *,
    source: Any,
    template: Any = None,
    column_map: Mapping[str, str] | None = None,
    answer_column: str = "answer",
    split: str = "train",
    subset: str | None = None,
    chat_format: Any = None,
    system_prompt: str | None = None,
    max_prompt_len: int | None = None,
    filter_fn: Callable | None = None,
    skip_bad_rows: bool = False,
    name: str | None = None,
) -> PromptDataset:
    """Prompts for generation with their reference answers.

    Args: source/split/subset/column_map/filter_fn/skip_bad_rows/name as in `instruct_dataset`;
    template builds the prompt text from the row (default: the ``input`` column); answer_column
    (default ``answer``) is returned as is; chat_format lays the prompt out and appends the assistant
    header ("tokenizer" = the tokenizer's template with its generation prompt; None = plain text);
    max_prompt_len: a longer prompt is a bad row (skipped with `skip_bad_rows`).
    Raises `DataError` naming source, row and field.
    """
    if max_prompt_len is not None and (not isinstance(max_prompt_len, int) or max_prompt_len < 1):
        raise DataError(f"max_prompt_len: must be a positive integer, got {max_prompt_len!r}")
    tmpl = resolve_template(template)
    convert = _PromptConvert(
        tokenizer, tmpl, resolve_chat_format(chat_format), system_prompt, answer_column, max_prompt_len
    )
    label = default_name(source) if isinstance(source, (list, tuple)) else str(source)
    items, report = run_rows(
        load_rows(source, split, subset),
        source_label=label,
        column_map=column_map,
        convert=convert,
        filter_fn=filter_fn,
        skip_bad_rows=skip_bad_rows,
        template=tmpl,
    )
    return PromptDataset(
        items,
        name=name or default_name(source),
        pad_id=int(getattr(tokenizer, "pad_id", 0) or 0),
        report=report,
    )


def prompt_collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"prompts": list[list[int]] (unpadded; `generate` pads), "answers": list[str],
    "source_ids": LongTensor [B]}``."""
    return {
        "prompts": [list(s["prompt_tokens"]) for s in batch],
        "answers": [s["answer"] for s in batch],
        "source_ids": torch.tensor([int(s.get("source_id", 0)) for s in batch], dtype=torch.long),
    }


def demo_prompt_dataset(
    tokenizer,
    *,
    n: int = 3000,
    seed: int = 0,
    split: str = "train",
    chat_format: Any = "auto",
    max_prompt_len: int | None = None,
) -> PromptDataset:
    """The demo problems as prompts with their worked answers (``#### value``) for GRPO; `chat_format`
    "auto" uses the tokenizer's chat template when it has one, else the plain Question/Answer prompt."""
    from engine.data.demo import demo_layout, demo_rows

    chat_format, template = demo_layout(tokenizer, chat_format)
    return prompt_dataset(
        tokenizer,
        source=demo_rows(n, seed, split),
        template=template,
        chat_format=chat_format,
        max_prompt_len=max_prompt_len,
        name="demo",
    )
