"""Dataset builders: `tokenizer` first, then keyword settings, so a recipe calls
``instantiate(cfg.dataset, tokenizer=tok)`` (or `build_dataset`).

Common arguments:
  source: local file/folder (json, jsonl, csv, parquet, txt, optionally .gz), a Hub dataset name, or a
    list of row dicts.
  split: split to read ("train"; slices like "train[:1000]" work). subset: Hub config name.
  column_map: ``{expected_column: your_column}``, e.g. ``{output: summary}``.
  max_seq_len: truncate each sample to this many tokens; the final token (EOS / end of turn) is kept.
  filter_fn: callable ``row -> bool`` applied after column_map; False drops the row. From YAML use
    `engine.data.ColumnFilter`; a lambda or plain function turns the cache off.
  skip_bad_rows: drop unusable rows and report their count, instead of stopping at the first.
  packed: return a `PackedDataset` of `max_seq_len`-long packs instead (needs max_seq_len).
  name: the source's name in logs (``loss/<name>``); default from the source.
  cache: reuse/store the tokenized result under ``$TUNEBENCH_HOME/cache/data``.
  mask_headers: (instruct/chat/preference with a chat format) also mask the role header of trained
    turns, e.g. Llama 3's ``<|start_header_id|>assistant<|end_header_id|>\\n\\n`` (default false: a
    trained turn trains its header, as torchtune 0.6.1 does; see `engine.data.chat_formats`).
  num_proc: tokenize in this many worker processes (default 1; worth it from ~10k rows, each worker
    pays ~2-3 s to start; a lambda `filter_fn` keeps it in one process).
All raise `DataError` (a `ConfigError`) with one line naming the source, row and field at fault.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.data.chat_formats import TokenizerChatTemplate, resolve_chat_format
from engine.data.data_errors import DataError
from engine.data.dataset import PreferenceDataset, TokenizedDataset, build_tokenized, common_args
from engine.data.messages import (
    ChosenRejectedToMessages,
    InputOutputToMessages,
    Message,
    OpenAIToMessages,
    ShareGPTToMessages,
    TextToMessages,
)
from engine.data.templates import resolve_template


class ConversationToMessages:
    """ShareGPT or OpenAI rows -> messages; `style` "auto" picks by column (``conversations`` ->
    ShareGPT, else ``messages``). `system_prompt` is prepended when a conversation has none."""

    def __init__(self, style: str = "auto", train_on_input: bool = False, system_prompt: str | None = None):
        self.style = style
        self.train_on_input = train_on_input
        self.system_prompt = system_prompt
        self._sharegpt = ShareGPTToMessages(train_on_input, system_prompt)
        self._openai = OpenAIToMessages(train_on_input)

    def __call__(self, row):
        if self.style == "sharegpt" or (self.style == "auto" and "conversations" in row):
            return self._sharegpt(row)
        msgs = self._openai(row)
        if self.system_prompt and msgs[0].role != "system":
            msgs.insert(0, Message("system", self.system_prompt, not self.train_on_input))
        return msgs

    def __repr__(self) -> str:
        return f"ConversationToMessages({self.style!r}, {self.train_on_input}, {self.system_prompt!r})"


class _BlankText:
    """True for rows whose `column` is blank text (dropped by `text_completion_dataset`)."""

    def __init__(self, column: str):
        self.column = column

    def __call__(self, row) -> bool:
        v = row.get(self.column)
        return isinstance(v, str) and not v.strip()


def _maybe_pack(ds, packed: bool, max_seq_len: int | None, split_across_pack: bool = False):
    if not packed:
        return ds
    if max_seq_len is None:
        raise DataError("packed: needs max_seq_len (the length of each pack); set dataset.max_seq_len")
    from engine.data.packing import PackedDataset

    return PackedDataset(ds, max_seq_len=max_seq_len, split_across_pack=split_across_pack)


def instruct_dataset(
    tokenizer,
    *,
    source: Any,
    template: Any = None,
    column_map: Mapping[str, str] | None = None,
    train_on_input: bool = False,
    split: str = "train",
    subset: str | None = None,
    chat_format: Any = None,
    system_prompt: str | None = None,
    max_seq_len: int | None = None,
    filter_fn: Callable | None = None,
    skip_bad_rows: bool = False,
    packed: bool = False,
    split_across_pack: bool = False,
    name: str | None = None,
    cache: bool = True,
    mask_headers: bool = False,
    num_proc: int = 1,
) -> TokenizedDataset:
    """Prompt/response rows: the prompt is `template` applied to the row (default: the ``input``
    column as is), the response is the ``output`` column.

    Args (beyond the common ones): template: a template instance, a dotted name
    (``engine.data.AlpacaInstructTemplate``) or a ``"...{column}..."`` string; train_on_input: train on
    the prompt tokens too (default False); chat_format: None lays out BOS + prompt + response + EOS,
    or a chat format wraps prompt and response as user/assistant turns; system_prompt: a system turn.
    """
    tmpl = resolve_template(template)
    ds = build_tokenized(
        tokenizer,
        kind="sft",
        transform=InputOutputToMessages(tmpl, train_on_input=train_on_input, system_prompt=system_prompt),
        chat_format=resolve_chat_format(chat_format, mask_headers),
        template=tmpl,
        **common_args(locals()),
    )
    return _maybe_pack(ds, packed, max_seq_len, split_across_pack)


def chat_dataset(
    tokenizer,
    *,
    source: Any,
    conversation_style: str = "auto",
    column_map: Mapping[str, str] | None = None,
    train_on_input: bool = False,
    split: str = "train",
    subset: str | None = None,
    chat_format: Any = None,
    system_prompt: str | None = None,
    max_seq_len: int | None = None,
    filter_fn: Callable | None = None,
    skip_bad_rows: bool = False,
    packed: bool = False,
    split_across_pack: bool = False,
    name: str | None = None,
    cache: bool = True,
    mask_headers: bool = False,
    num_proc: int = 1,
) -> TokenizedDataset:
    """Multi-turn conversations.

    Args (beyond the common ones): conversation_style: "sharegpt" (``conversations: [{from, value}]``),
    "openai" (``messages: [{role, content}]``) or "auto" (by column); chat_format: default None uses the
    tokenizer's own chat template; train_on_input: train on user/system turns too.
    """
    styles = ("auto", "sharegpt", "openai")
    if conversation_style not in styles:
        raise DataError(f"conversation_style: {conversation_style!r} is not one of {', '.join(styles)}")
    transform = ConversationToMessages(conversation_style, train_on_input, system_prompt)

    fmt = TokenizerChatTemplate() if chat_format is None else resolve_chat_format(chat_format)
    fmt = resolve_chat_format(fmt, mask_headers)
    ds = build_tokenized(tokenizer, kind="sft", transform=transform, chat_format=fmt, **common_args(locals()))
    return _maybe_pack(ds, packed, max_seq_len, split_across_pack)


def preference_dataset(
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
) -> PreferenceDataset:
    """Chosen/rejected pairs (see `ChosenRejectedToMessages` for the three row shapes read).

    Args (beyond the common ones): template: builds the prompt from the row (e.g.
    `StackExchangedPairedTemplate` with ``column_map: {chosen: response_j, rejected: response_k}``);
    chat_format: None = plain BOS + prompt + response + EOS.
    """
    tmpl = resolve_template(template)
    return build_tokenized(
        tokenizer,
        kind="preference",
        transform=ChosenRejectedToMessages(tmpl, train_on_input),
        chat_format=resolve_chat_format(chat_format, mask_headers),
        template=tmpl,
        **common_args(locals()),
    )


def text_completion_dataset(
    tokenizer,
    *,
    source: Any,
    column: str = "text",
    sample_by: str = "line",
    split: str = "train",
    subset: str | None = None,
    max_seq_len: int | None = None,
    filter_fn: Callable | None = None,
    skip_bad_rows: bool = False,
    packed: bool = False,
    split_across_pack: bool | None = None,
    name: str | None = None,
    cache: bool = True,
    num_proc: int = 1,
) -> TokenizedDataset:
    """Plain text, every token trained: BOS (where the tokenizer uses one) + text + EOS. Blank rows are
    dropped (counted in `filtered`). `.txt` files give one row per line; pack them with ``packed: true``.

    Args (beyond the common ones): column: the text column (default ``text``); sample_by: how a
    local .txt file becomes rows: "line" (default), "paragraph" or "document"; split_across_pack:
    default True when packed, so long documents continue in the next pack instead of being truncated
    (no truncation happens then; `max_seq_len` is the pack length).
    """
    if split_across_pack is None:
        split_across_pack = packed
    truncate_to = None if (packed and split_across_pack) else max_seq_len
    ds = build_tokenized(
        tokenizer,
        kind="sft",
        transform=TextToMessages(column),
        chat_format=resolve_chat_format(None),
        skip_blank=_BlankText(column),
        sample_by=sample_by,
        **{**common_args(locals()), "column_map": None, "max_seq_len": truncate_to},
    )
    return _maybe_pack(ds, packed, max_seq_len, split_across_pack)
