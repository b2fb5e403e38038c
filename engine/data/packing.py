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

from engine.data.data_errors import DataError
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

    kind = "sft"  # what a sample holds: "sft", "preference" or "prompt"

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

    def _sample(self, i: int) -> tuple[np.ndarray, np.ndarray, int]:
        fast = getattr(self.ds, "sample_arrays", None)
        if fast is not None:
            return fast(i)
        s = self.ds[i]
        return (
            np.asarray(s["tokens"], dtype=np.int64),
            np.asarray(s["labels"], dtype=np.int64),
            int(s.get("source_id", 0)),
        )

    def _pack_all(self) -> None:
        L = self.max_seq_len
        pieces: list[tuple[np.ndarray, np.ndarray, int]] = []  # documents of the pack being filled
        used = 0

        def flush():
            nonlocal pieces, used
            if pieces:
                self._packs.append(self._finish(pieces, used))
            pieces, used = [], 0

        for i in range(len(self.ds)):
            toks, labs, src = self._sample(i)
            if len(toks) > L and not self.split_across_pack:
                raise DataError(
                    f"packing: sample {i} has {len(toks)} tokens, more than max_seq_len={L}; set the dataset's "
                    "max_seq_len to at most the pack length, or split_across_pack: true"
                )
            while len(toks):
                if len(toks) > L - used and not self.split_across_pack:
                    flush()
                take = min(L - used, len(toks))
                pieces.append((toks[:take], labs[:take], src))
                used += take
                toks, labs = toks[take:], labs[take:]
                if used == L:
                    flush()
        flush()
        self._real_tokens = sum(int((p["source_ids"] >= 0).sum()) for p in self._packs)

    def _finish(self, pieces: list[tuple[np.ndarray, np.ndarray, int]], used: int) -> dict[str, np.ndarray]:
        L = self.max_seq_len
        n_pad = L - used
        out = {
            "tokens": np.full(L, self.pad_id, dtype=np.int64),
            "labels": np.full(L, IGNORE_INDEX, dtype=np.int64),
            "position_ids": np.empty(L, dtype=np.int64),
            "document_ids": np.empty(L, dtype=np.int64),
            "source_ids": np.full(L, -1, dtype=np.int64),
        }
        at = 0
        for doc, (toks, labs, src) in enumerate(pieces):
            n = len(toks)
            out["tokens"][at : at + n] = toks
            out["labels"][at : at + n] = labs
            out["position_ids"][at : at + n] = np.arange(n)
            out["document_ids"][at : at + n] = doc
            out["source_ids"][at : at + n] = src
            at += n
        out["position_ids"][at:] = np.arange(n_pad)  # the padding run: a document of its own
        out["document_ids"][at:] = len(pieces)
        return out

    def __len__(self) -> int:
        return len(self._packs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        p = self._packs[i]
        return {k: v.tolist() for k, v in p.items()}

    @property
    def lengths(self) -> np.ndarray:
        """Real (non-padding) tokens per pack."""
        return np.array([int((p["source_ids"] >= 0).sum()) for p in self._packs], dtype=np.int64)

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
