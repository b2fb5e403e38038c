"""`tokenize_messages`: messages -> token ids and a loss mask, for any tokenizer and chat format.

Each `Unit` of the chat format is encoded in ONE tokenizer call, so the ids equal what the format's
reference implementation produces. Where a unit holds trained and masked text, the boundary token is
found by encoding the text up to the boundary and taking the common prefix with the whole unit's ids:
a token that straddles the boundary (rare; BPE merges across it) counts as trained.
"""

from __future__ import annotations

from engine.data.chat_formats import ChatFormat, Unit, resolve_chat_format
from engine.data.messages import Message

IGNORE_INDEX = -100


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _merge(unit: Unit) -> list[tuple[str, bool]]:
    merged: list[tuple[str, bool]] = []
    for seg in unit.segments:
        if merged and merged[-1][1] == seg.masked:
            merged[-1] = (merged[-1][0] + seg.text, seg.masked)
        else:
            merged.append((seg.text, seg.masked))
    return merged


def encode_unit(tokenizer, unit: Unit) -> tuple[list[int], list[bool]]:
    """Ids and mask (True = excluded from the loss) of one unit."""
    parts = _merge(unit)
    text = "".join(t for t, _ in parts)
    ids = tokenizer.encode(text, add_bos=False, add_eos=False) if text else []
    mask = [False] * len(ids)
    start = 0
    prefix = ""
    for k, (t, masked) in enumerate(parts):
        prefix += t
        if k == len(parts) - 1:
            stop = len(ids)
        else:
            stop = _common_prefix(tokenizer.encode(prefix, add_bos=False, add_eos=False), ids)
            stop = max(stop, start)
        for i in range(start, stop):
            mask[i] = masked
        start = stop
    if unit.bos and getattr(tokenizer, "bos_id", None) is not None:
        ids, mask = [tokenizer.bos_id, *ids], [True, *mask]
    if unit.eos and tokenizer.eos_id is not None:
        ids, mask = [*ids, tokenizer.eos_id], [*mask, unit.eos_masked]
    return ids, mask


def tokenize_messages(
    tokenizer,
    messages: list[Message],
    chat_format: ChatFormat | str | None = None,
    max_seq_len: int | None = None,
) -> tuple[list[int], list[bool]]:
    """Token ids and loss mask (True = excluded) of a conversation.

    Args:
      tokenizer: an `engine.data.tokenizers` tokenizer (`encode`, `bos_id`, `eos_id`, ...).
      messages: the turns, with `masked` set by the transform.
      chat_format: a `ChatFormat`, its name, or None for plain concatenation with BOS/EOS.
      max_seq_len: truncate to this many tokens, keeping the final token (EOS / end of turn) last.
    Raises `RowError` when the format cannot lay out the messages.
    """
    fmt = resolve_chat_format(chat_format)
    ids: list[int] = []
    mask: list[bool] = []
    for unit in fmt.units(messages, tokenizer):
        u_ids, u_mask = encode_unit(tokenizer, unit)
        ids += u_ids
        mask += u_mask
    if max_seq_len is not None and len(ids) > max_seq_len:
        last, last_mask = ids[-1], mask[-1]
        ids, mask = ids[:max_seq_len], mask[:max_seq_len]
        ids[-1], mask[-1] = last, last_mask
    return ids, mask


def shifted_labels(ids: list[int], mask: list[bool]) -> list[int]:
    """Labels already shifted for the loss: ``labels[i] = ids[i+1]`` unless that token is masked
    (then -100); the last position has no target (-100)."""
    labels = [IGNORE_INDEX] * len(ids)
    for i in range(len(ids) - 1):
        if not mask[i + 1]:
            labels[i] = ids[i + 1]
    return labels


def tokenize_prompt(
    tokenizer, messages: list[Message], chat_format: ChatFormat | str | None = None
) -> list[int]:
    """Token ids of a generation prompt: `messages` (usually system + user) laid out by the chat
    format and followed by the assistant header, so the model's next token starts the answer.
    Plain format: BOS (where used) + the texts, no EOS. Raises `RowError` like `tokenize_messages`."""
    fmt = resolve_chat_format(chat_format)
    ids: list[int] = []
    for unit in fmt.prompt_units(messages, tokenizer):
        ids += encode_unit(tokenizer, unit)[0]
    return ids
