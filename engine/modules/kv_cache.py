"""Static key/value cache for incremental decoding."""

import torch
from torch import nn


class KVCache(nn.Module):
    """Preallocated `[B, H_kv, max_seq_len, head_dim]` key and value buffers.

    Args:
        batch_size (int), max_seq_len (int), num_kv_heads (int), head_dim (int).
        dtype (torch.dtype): storage dtype (the model's compute dtype).
        device: where to allocate; default CPU.

    `update(input_pos [S] long, k [B,H_kv,S,hd], v)` writes the new entries at cache slots
    `input_pos` (shared by all rows: left-pad prompts of different lengths) and returns the whole
    cache `(k_all, v_all)`, each `[B,H_kv,max_seq_len,hd]`; attention masks out unwritten slots.
    Raises ValueError when the batch is larger than the cache.
    """

    def __init__(
        self,
        batch_size: int,
        max_seq_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        shape = (batch_size, num_kv_heads, max_seq_len, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.batch_size = batch_size
        self.max_seq_len = max_seq_len

    def reset(self) -> None:
        self.k_cache.zero_()
        self.v_cache.zero_()

    def update(
        self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch = k.shape[0]
        if batch > self.batch_size:
            raise ValueError(f"KV cache holds {self.batch_size} rows but the batch has {batch}")
        # index_copy_ along the sequence dim: k [B,H,S,hd] into slots input_pos of [B,H,L,hd]
        self.k_cache[:batch].index_copy_(2, input_pos, k.to(self.k_cache.dtype))
        self.v_cache[:batch].index_copy_(2, input_pos, v.to(self.v_cache.dtype))
        return self.k_cache[:batch], self.v_cache[:batch]
