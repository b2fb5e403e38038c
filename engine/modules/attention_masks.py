"""Boolean attention masks (True = may attend) for packing, caching and sliding windows."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class AttentionSpec(ABC):
    """A mask that computes attention itself, passed as `mask` to the attention modules.

    FlexAttention block masks (`engine.modules.flex_attention`) and context-parallel rings
    (`engine.training.context_parallel`) are built once per forward by the decoder and used by every
    layer. `attend(q [B,H,S,hd], k, v [B,H_kv,S_kv,hd], *, dropout_p) -> [B,H,S,hd]`.
    """

    @abstractmethod
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float) -> torch.Tensor:
        """Attention of `q` over `k`/`v` under this mask (GQA: H a multiple of H_kv)."""


def causal_mask(seq_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Lower-triangular `[S,S]` bool mask."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


def block_causal_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """`[B,S,S]` mask from `document_ids [B,S]`: token i sees token j iff j <= i and same document."""
    s = document_ids.shape[1]
    same_doc = document_ids[:, :, None] == document_ids[:, None, :]  # [B,S,S]
    return same_doc & causal_mask(s, document_ids.device)


def cache_causal_mask(input_pos: torch.Tensor, cache_len: int) -> torch.Tensor:
    """`[S, cache_len]` mask for new tokens at cache slots `input_pos [S]`: slot j visible iff j <= pos."""
    slots = torch.arange(cache_len, device=input_pos.device)
    return slots[None, :] <= input_pos[:, None]


def sliding_window_mask(query_pos: torch.Tensor, key_len: int, window: int) -> torch.Tensor:
    """`[S, key_len]` band: query at position p sees keys at p - window < j (Mistral-style window)."""
    slots = torch.arange(key_len, device=query_pos.device)
    return slots[None, :] > (query_pos[:, None] - window)
