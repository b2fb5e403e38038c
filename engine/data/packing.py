"""Packing: many samples into fixed-length sequences with document boundaries respected.

Each pack is `max_seq_len` tokens: documents placed back to back greedily in dataset order, then
padding. Per token it carries:
  position_ids  restart at 0 for every document (and for the padding run);
  document_ids  0, 1, 2, ... per document in the pack; the padding run gets its own id, so attention
                (block-causal on document_ids) never crosses a document;
  labels        the samples' already-shifted labels, so a document's last token has label -100 and
                nothing predicts across a boundary; -100 on padding;
  source_ids    the sample's source id, -1 on padding.
`split_across_pack=False` moves a document that does not fit into the next pack; True fills every
pack and continues the document in the next one (as a new document with positions from 0).
`efficiency` is the share of non-padding tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils.data import Dataset

from engine.data.errors import DataError
from engine.data.tokenize import IGNORE_INDEX


class PackedDataset(Dataset):
    """Pack `ds` (samples ``{"tokens", "labels", "source_id"}``) into `max_seq_len`-token sequences.

    Args:
      ds: a dataset of samples (e.g. from `instruct_dataset`, a concatenation or a mix).
      max_seq_len: tokens per pack.
      split_across_pack: let a document continue in the next pack (default False).
      pad_id: padding token; default `ds.pad_id` (0 when absent).
    Raises `DataError` when a sample is longer than `max_seq_len` and `split_across_pack` is False.
    Packing reads every sample once, up front.
    """

    packed = True

    def __init__(self, ds, max_seq_len: int, split_across_pack: bool = False, pad_id: int | None = None):
        if not isinstance(max_seq_len, int) or max_seq_len < 2:
            raise DataError(f"max_seq_len: packing needs an integer >= 2, got {max_seq_len!r}")
        self.ds = ds
        self.max_seq_len = max_seq_len
        self.split_across_pack = split_across_pack
        self.pad_id = int(pad_id if pad_id is not None else getattr(ds, "pad_id", 0) or 0)
        self.source_names = list(getattr(ds, "source_names", ["data"]))
        self._packs: list[dict[str, np.ndarray]] = []
        self._pack_all()

    def _pack_all(self) -> None:
        L = self.max_seq_len
        buf: dict[str, list[int]] = {
            k: [] for k in ("tokens", "labels", "position_ids", "document_ids", "source_ids")
        }
        doc = 0

        def flush():
            nonlocal buf, doc
            if buf["tokens"]:
                self._packs.append(self._finish(buf, doc))
            buf = {k: [] for k in buf}
            doc = 0

        for i in range(len(self.ds)):
            s = self.ds[i]
            toks, labs, src = list(s["tokens"]), list(s["labels"]), int(s.get("source_id", 0))
            if len(toks) > L and not self.split_across_pack:
                raise DataError(
                    f"packing: sample {i} has {len(toks)} tokens, more than max_seq_len={L}; set the dataset's "
                    "max_seq_len to at most the pack length, or split_across_pack: true"
                )
            while toks:
                room = L - len(buf["tokens"])
                if len(toks) > room and not self.split_across_pack:
                    flush()
                    room = L
                take = min(room, len(toks))
                buf["tokens"] += toks[:take]
                buf["labels"] += labs[:take]
                buf["position_ids"] += list(range(take))
                buf["document_ids"] += [doc] * take
                buf["source_ids"] += [src] * take
                doc += 1
                toks, labs = toks[take:], labs[take:]
                if len(buf["tokens"]) == L:
                    flush()
        flush()
        self._real_tokens = sum(int((p["source_ids"] >= 0).sum()) for p in self._packs)

    def _finish(self, buf: dict[str, list[int]], doc: int) -> dict[str, np.ndarray]:
        n_pad = self.max_seq_len - len(buf["tokens"])
        out = {
            "tokens": buf["tokens"] + [self.pad_id] * n_pad,
            "labels": buf["labels"] + [IGNORE_INDEX] * n_pad,
            "position_ids": buf["position_ids"] + list(range(n_pad)),
            "document_ids": buf["document_ids"] + [doc] * n_pad,
            "source_ids": buf["source_ids"] + [-1] * n_pad,
        }
        return {k: np.asarray(v, dtype=np.int64) for k, v in out.items()}

    def __len__(self) -> int:
        return len(self._packs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        p = self._packs[i]
        return {k: v.tolist() for k, v in p.items()}

    @property
    def efficiency(self) -> float:
        """Share of non-padding tokens over all packs (1.0 = no padding)."""
        total = len(self._packs) * self.max_seq_len
        return self._real_tokens / total if total else 0.0

    def stats(self) -> dict[str, float]:
        """``{"packs", "samples", "tokens", "efficiency"}``."""
        return {
            "packs": len(self._packs),
            "samples": len(self.ds),
            "tokens": self._real_tokens,
            "efficiency": self.efficiency,
        }
