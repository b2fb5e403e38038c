"""Unpaired desirable/undesirable data for KTO: rows of ``prompt``, ``completion``, ``label``.

The row shape TRL's KTO datasets use: ``label`` is a bool (True = desirable). The prompt is formatted
by `template` when given (else the ``prompt`` column as is), wrapped by the chat format like any
instruct row, and masked; the loss mask is on the completion. A sample is
``{"tokens", "labels" (shifted), "desirable": bool, "source_id"}``; `padded_collate_unpaired` stacks
them into ``tokens``/``labels``/``position_ids [B,S]`` and ``desirable [B]`` (bool).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from engine.data.collate import padded_collate
from engine.data.dataset import OneSourceDataset
from engine.data.messages import Message, RowError, get_text
from engine.data.tokenize import IGNORE_INDEX, shifted_labels


class PromptCompletionLabelToMessages:
    """``{prompt, completion, label}`` -> ``([user, assistant], desirable)``.

    Args:
      template: prompt template building the user text from the row (None: the ``prompt`` column).
      train_on_input: train on the prompt tokens too (default False).
    """

    def __init__(self, template=None, train_on_input: bool = False):
        self.template = template
        self.train_on_input = train_on_input

    def __call__(self, row: Mapping[str, Any]) -> tuple[list[Message], bool]:
        if "label" not in row:
            cols = ", ".join(map(str, row)) or "none"
            raise RowError(
                "label", f"missing column (columns: {cols}); map it with column_map: {{label: <your column>}}"
            )
        label = row["label"]
        if label is None:  # a column other rows have: this row leaves it out
            raise RowError("label", "missing or null; set it to true (desirable) or false (undesirable)")
        if not isinstance(label, (bool, np.bool_)):
            raise RowError(
                "label",
                f"expected true (desirable) or false (undesirable), got {type(label).__name__} {label!r}",
            )
        prompt = self.template.format(row) if self.template is not None else get_text(row, "prompt")
        msgs = [
            Message("user", prompt, not self.train_on_input),
            Message("assistant", get_text(row, "completion")),
        ]
        return msgs, bool(label)

    def __repr__(self) -> str:
        return f"PromptCompletionLabelToMessages({self.template!r}, {self.train_on_input})"


class UnpairedDataset(OneSourceDataset):
    """Labelled completions of one source, tokenized. Built by `unpaired_dataset`."""

    kind = "unpaired"

    def __init__(self, flat, desirable: np.ndarray, *, name: str, pad_id: int, report) -> None:
        super().__init__(name=name, pad_id=pad_id, report=report)
        self._flat, self.desirable = flat, np.asarray(desirable, dtype=bool)

    def __len__(self) -> int:
        return len(self._flat)

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = self._index(i)
        ids, mask = self._flat.get(i)
        return {"tokens": ids, "labels": shifted_labels(ids, mask), "desirable": bool(self.desirable[i]),
                "source_id": self.source_id}  # fmt: skip

    @property
    def lengths(self) -> np.ndarray:
        return self._flat.lengths()


def padded_collate_unpaired(
    batch: list[dict[str, Any]], pad_id: int = 0, ignore_index: int = IGNORE_INDEX
) -> dict[str, torch.Tensor]:
    """`padded_collate` (``tokens``, ``labels``, ``position_ids``, ``source_ids`` ``[B,S]``) plus
    ``desirable [B]`` bool."""
    out = padded_collate(batch, pad_id=pad_id, ignore_index=ignore_index)
    out["desirable"] = torch.tensor([bool(s["desirable"]) for s in batch], dtype=torch.bool)
    return out


def unpaired_dataset(
    tokenizer,
    *,
    source: Any,
    template: Any = None,
    column_map: Mapping[str, str] | None = None,
    train_on_input: bool = False,
    split: str = "train",
    subset: str | None = None,
    chat_format: Any = None,
    max_seq_len: int | None = None,
    filter_fn: Callable | None = None,
    skip_bad_rows: bool = False,
    name: str | None = None,
    cache: bool = True,
    mask_headers: bool = False,
    num_proc: int = 1,
) -> UnpairedDataset:
    """KTO's unpaired rows (``prompt``, ``completion``, ``label``: bool). Args as `preference_dataset`;
    rename columns with ``column_map`` (e.g. ``{completion: response, label: is_good}``)."""
    from engine.data.chat_formats import resolve_chat_format
    from engine.data.dataset import build_tokenized, common_args
    from engine.data.templates import resolve_template

    tmpl = resolve_template(template)
    return build_tokenized(
        tokenizer,
        kind="unpaired",
        transform=PromptCompletionLabelToMessages(tmpl, train_on_input),
        chat_format=resolve_chat_format(chat_format, mask_headers),
        template=tmpl,
        **common_args(locals()),
    )
