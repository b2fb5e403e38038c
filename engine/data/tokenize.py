"""`tokenize_messages`: messages -> token ids and a loss mask, for any tokenizer and chat format.

Each `Unit` of the chat format is encoded in ONE tokenizer call, so the ids equal what the format's
reference implementation produces. Where a unit holds trained and masked text, each token's mask
comes from the characters it covers: a token is masked when all of them are masked text (so a token
that straddles a prompt/response boundary, where BPE merges across it, is trained).

Tokenizers with `encode_spans` (``tokenizer.json``: character offsets, batched; Llama 3 files run on
tiktoken) encode every unit once, and `tokenize_messages_batch` encodes a whole batch of samples in
one call. Other backends (SentencePiece, tiktoken files) find a boundary by encoding the text up to
it and taking the common prefix with the unit's ids.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from engine.data.chat_formats import ChatFormat, Unit, resolve_chat_format
from engine.data.messages import Message, RowError

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


def _mask_from_spans(parts: list[tuple[str, bool]], starts: list[int], ends: list[int]) -> list[bool]:
    """Token i is masked when [starts[i], ends[i]) lies inside one masked part."""
    mask = [False] * len(starts)
    pos = 0
    for text, masked in parts:
        a, b = pos, pos + len(text)
        pos = b
        if masked:
            lo, hi = bisect_left(starts, a), bisect_right(ends, b)
            if hi > lo:
                mask[lo:hi] = [True] * (hi - lo)
    return mask


def _mask_by_prefix(tokenizer, parts: list[tuple[str, bool]], ids: list[int]) -> list[bool]:
    mask = [False] * len(ids)
    start = 0
    prefix = ""
    for k, (t, masked) in enumerate(parts):
        prefix += t
        if k == len(parts) - 1:
            stop = len(ids)
        else:
            stop = max(_common_prefix(tokenizer.encode(prefix, add_bos=False, add_eos=False), ids), start)
        mask[start:stop] = [masked] * (stop - start)
        start = stop
    return mask


def _finish(tokenizer, unit: Unit, ids: list[int], mask: list[bool]) -> tuple[list[int], list[bool]]:
    """`ids`/`mask` with BOS (exactly once) and EOS added as `unit` says; new lists, one copy each."""
    bos = getattr(tokenizer, "bos_id", None)
    head = unit.bos and bos is not None and not (ids and ids[0] == bos)
    tail = unit.eos and tokenizer.eos_id is not None
    if head and tail:
        return [bos, *ids, tokenizer.eos_id], [True, *mask, unit.eos_masked]
    if head:
        return [bos, *ids], [True, *mask]
    if tail:
        return [*ids, tokenizer.eos_id], [*mask, unit.eos_masked]
    return list(ids), mask


def encode_units(tokenizer, units: list[Unit]) -> list[tuple[list[int], list[bool]]]:
    """Ids and mask (True = excluded from the loss) of each unit; one batched call where the
    tokenizer has `encode_spans`."""
    merged = [_merge(u) for u in units]
    texts = ["".join(t for t, _ in parts) for parts in merged]
    out = []
    if hasattr(tokenizer, "encode_spans"):
        todo = [i for i, t in enumerate(texts) if t]
        spans = dict(zip(todo, tokenizer.encode_spans([texts[i] for i in todo])))
        for i, (unit, parts) in enumerate(zip(units, merged)):
            ids, starts, ends = spans.get(i, ([], [], []))
            out.append(_finish(tokenizer, unit, ids, _mask_from_spans(parts, starts, ends)))
        return out
    for unit, parts, text in zip(units, merged, texts):
        ids = tokenizer.encode(text, add_bos=False, add_eos=False) if text else []
        out.append(_finish(tokenizer, unit, ids, _mask_by_prefix(tokenizer, parts, ids)))
    return out


def encode_unit(tokenizer, unit: Unit) -> tuple[list[int], list[bool]]:
    """Ids and mask (True = excluded from the loss) of one unit."""
    return encode_units(tokenizer, [unit])[0]


def _truncate(ids: list[int], mask: list[bool], max_seq_len: int | None) -> tuple[list[int], list[bool]]:
    if max_seq_len is not None and len(ids) > max_seq_len:
        last, last_mask = ids[-1], mask[-1]
        ids, mask = ids[:max_seq_len], mask[:max_seq_len]
        ids[-1], mask[-1] = last, last_mask
    return ids, mask


def tokenize_messages_batch(
    tokenizer,
    conversations: list[list[Message]],
    chat_format: ChatFormat | str | None = None,
    max_seq_len: int | None = None,
) -> list[tuple[list[int], list[bool]] | RowError]:
    """`tokenize_messages` for many conversations, encoded in one batched call: for each, its
    ``(ids, mask)``, or the `RowError` the format raised for it."""
    fmt = resolve_chat_format(chat_format)
    layouts: list[list[Unit] | RowError] = []
    for messages in conversations:
        try:
            layouts.append(fmt.units(messages, tokenizer))
        except RowError as exc:
            layouts.append(exc)
    flat = [u for lay in layouts if not isinstance(lay, RowError) for u in lay]
    encoded = iter(encode_units(tokenizer, flat))
    out: list[tuple[list[int], list[bool]] | RowError] = []
    for lay in layouts:
        if isinstance(lay, RowError):
            out.append(lay)
            continue
        if len(lay) == 1:  # one unit (plain format): its lists are already this sample's own
            ids, mask = next(encoded)
        else:
            ids, mask = [], []
            for _ in lay:
                u_ids, u_mask = next(encoded)
                ids += u_ids
                mask += u_mask
        out.append(_truncate(ids, mask, max_seq_len))
    return out


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
    for u_ids, u_mask in encode_units(tokenizer, fmt.units(messages, tokenizer)):
        ids += u_ids
        mask += u_mask
    return _truncate(ids, mask, max_seq_len)


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
