"""Collate functions: lists of samples -> batches of tensors.

`padded_collate`   unpacked SFT samples, right-padded to the longest in the batch.
`packed_collate`   samples of a `PackedDataset` (already fixed length): stacked, with `document_ids`.
`padded_collate_dpo`  preference pairs; see its docstring for the layout.
Labels arrive already shifted (see docs/ARCHITECTURE.md), so no collate shifts anything.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.data.tokenize import IGNORE_INDEX


def _pad(rows: list[list[int]], value: int, length: int) -> torch.Tensor:
    out = torch.full((len(rows), length), value, dtype=torch.long)
    for b, r in enumerate(rows):
        out[b, : len(r)] = torch.as_tensor(r, dtype=torch.long)
    return out


def padded_collate(
    batch: list[dict[str, Any]],
    pad_id: int = 0,
    ignore_index: int = IGNORE_INDEX,
    pad_to_multiple_of: int = 1,
) -> dict[str, torch.Tensor]:
    """Right-pad a list of ``{"tokens", "labels", "source_id"}`` samples.

    Returns ``tokens [B,S]`` (pad_id on padding), ``labels [B,S]`` (ignore_index on padding),
    ``position_ids [B,S]`` (0..S-1 per row), ``source_ids [B,S]`` (the sample's source id, -1 on padding).
    S is the longest sample, rounded up to `pad_to_multiple_of` (e.g. 8 or 64 for GPU kernels). Right padding with a causal model needs no attention mask: real tokens
    never attend to the padding after them.
    """
    lengths = [len(s["tokens"]) for s in batch]
    m = max(1, int(pad_to_multiple_of))
    S = -(-max(lengths) // m) * m
    B = len(batch)
    tokens = _pad([s["tokens"] for s in batch], pad_id, S)  # [B, S]
    labels = _pad([s["labels"] for s in batch], ignore_index, S)  # [B, S]
    position_ids = torch.arange(S, dtype=torch.long).unsqueeze(0).expand(B, S).clone()  # [B, S]
    source_ids = torch.full((B, S), -1, dtype=torch.long)  # [B, S]
    for b, (s, n) in enumerate(zip(batch, lengths)):
        source_ids[b, :n] = int(s.get("source_id", 0))
    return {"tokens": tokens, "labels": labels, "position_ids": position_ids, "source_ids": source_ids}


def packed_collate(
    batch: list[dict[str, Any]], pad_id: int = 0, ignore_index: int = IGNORE_INDEX
) -> dict[str, torch.Tensor]:
    """Stack `PackedDataset` samples (all `max_seq_len` long): ``tokens``, ``labels``, ``position_ids``,
    ``document_ids``, ``source_ids``, each ``[B, max_seq_len]``. `pad_id`/`ignore_index` are unused
    (packs are padded already) and accepted so both collates share one call shape."""
    keys = ("tokens", "labels", "position_ids", "document_ids", "source_ids")
    return {k: torch.stack([torch.as_tensor(s[k], dtype=torch.long) for s in batch]) for k in keys}


def padded_collate_dpo(
    batch: list[dict[str, Any]], pad_id: int = 0, ignore_index: int = IGNORE_INDEX
) -> dict[str, torch.Tensor]:
    """Collate preference pairs.

    Returns ``chosen_tokens``, ``chosen_labels``, ``rejected_tokens``, ``rejected_labels``,
    ``chosen_position_ids``, ``rejected_position_ids``, ``chosen_attention_mask`` and
    ``rejected_attention_mask`` (bool, True on each sequence's own tokens, False on its padding; what
    the MoE load-balancing loss counts) and ``source_ids`` (per pair, ``[B]``).
    Chosen and rejected are padded to ONE common length S, so each is ``[B, S]`` and the
    concatenated layout a DPO recipe runs in one forward pass is simply
    ``torch.cat([chosen_tokens, rejected_tokens])`` -> ``[2B, S]`` (rows 0..B-1 chosen, B..2B-1 rejected).
    """
    S = max(max(len(s["chosen_tokens"]), len(s["rejected_tokens"])) for s in batch)
    B = len(batch)
    out = {
        "chosen_tokens": _pad([s["chosen_tokens"] for s in batch], pad_id, S),
        "chosen_labels": _pad([s["chosen_labels"] for s in batch], ignore_index, S),
        "rejected_tokens": _pad([s["rejected_tokens"] for s in batch], pad_id, S),
        "rejected_labels": _pad([s["rejected_labels"] for s in batch], ignore_index, S),
    }
    pos = torch.arange(S, dtype=torch.long).unsqueeze(0).expand(B, S).clone()
    out["chosen_position_ids"] = pos
    out["rejected_position_ids"] = pos.clone()
    for side in ("chosen", "rejected"):
        lengths = torch.tensor([len(s[f"{side}_tokens"]) for s in batch])
        out[f"{side}_attention_mask"] = pos < lengths[:, None]  # [B, S]
    out["source_ids"] = torch.tensor([int(s.get("source_id", 0)) for s in batch], dtype=torch.long)
    return out


def collate_for(dataset, *, pad_id: int):
    """`packed_collate` for packed samples (they carry `document_ids`), else `padded_collate` with `pad_id`."""
    from functools import partial

    if len(dataset) and "document_ids" in dataset[0]:
        return packed_collate
    return partial(padded_collate, pad_id=pad_id)
