"""Grouped-query self-attention on `F.scaled_dot_product_attention`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.modules.attention_masks import AttentionSpec
from engine.modules.kv_cache import KVCache
from engine.modules.rotary import apply_rotary


class GroupedQueryAttention(nn.Module):
    """Multi-head attention where `num_heads` query heads share `num_kv_heads` key/value heads.

    Args:
        num_heads (int), num_kv_heads (int; divides num_heads), head_dim (int).
        q_proj, k_proj, v_proj (nn.Module | None): `D -> heads * head_dim` projections (biased for Qwen2).
        qkv_proj (nn.Module | None): instead of those three, one fused `D -> (H + 2 H_kv) * head_dim`
            projection whose output is q, k, v one after the other (Phi-3's `qkv_proj`).
        output_proj (nn.Module): `num_heads * head_dim -> D`.
        q_norm, k_norm (nn.Module | None): per-head RMSNorm on queries/keys before RoPE (Qwen3).
        attn_dropout (float): dropout on attention probabilities in training; default 0.

    `forward(x [B,S,D], *, rope=(cos, sin) each [B,S,hd], mask [B,S,S_kv] bool | AttentionSpec | None,
    input_pos [S] long | None) -> [B,S,D]`. An `AttentionSpec` mask (FlexAttention, context-parallel
    ring) computes the attention itself. With `mask=None` and no cache the fused causal
    kernel (`is_causal=True`) is used. With a KV cache (`setup_cache`), `input_pos` gives the
    cache slots of the S new tokens and `mask` must cover the whole cache (`S_kv = max_seq_len`).
    Raises ValueError when heads do not divide, or unless exactly one of q/k/v or qkv_proj is given.
    """

    def __init__(
        self,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        q_proj: nn.Module | None = None,
        k_proj: nn.Module | None = None,
        v_proj: nn.Module | None = None,
        output_proj: nn.Module,
        qkv_proj: nn.Module | None = None,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        attn_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        separate = (q_proj, k_proj, v_proj)
        if (qkv_proj is None) == all(p is None for p in separate) or (qkv_proj is None and None in separate):
            raise ValueError("give either q_proj, k_proj and v_proj, or one fused qkv_proj")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.q_proj = q_proj
        self.k_proj = k_proj
        self.v_proj = v_proj
        self.qkv_proj = qkv_proj
        self.output_proj = output_proj
        self.q_norm = q_norm
        self.k_norm = k_norm
        self.attn_dropout = attn_dropout
        self.kv_cache: KVCache | None = None

    def setup_cache(
        self, batch_size: int, max_seq_len: int, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> None:
        self.kv_cache = KVCache(batch_size, max_seq_len, self.num_kv_heads, self.head_dim, dtype, device)

    def forward(
        self,
        x: torch.Tensor,
        *,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, s, _ = x.shape
        # [B,S,H*hd] -> [B,S,H,hd]; -1 heads so tensor parallelism (local heads only) needs no change
        if self.qkv_proj is not None:  # [B,S,(H + 2 H_kv)*hd] -> q, k, v
            kv = self.num_kv_heads * self.head_dim
            q, k, v = self.qkv_proj(x).split([self.num_heads * self.head_dim, kv, kv], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, s, -1, self.head_dim)
        k = k.view(b, s, -1, self.head_dim)
        v = v.view(b, s, -1, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.k_norm is not None:
            k = self.k_norm(k)
        # -> [B,H,S,hd]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = rope[0].unsqueeze(1), rope[1].unsqueeze(1)  # [B,1,S,hd]
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)

        if self.kv_cache is not None:
            if input_pos is None:
                raise ValueError("a model with KV caches needs input_pos (the cache slots of the new tokens)")
            k, v = self.kv_cache.update(input_pos, k, v)  # [B,H_kv,L,hd]

        dropout_p = self.attn_dropout if self.training else 0.0
        if isinstance(mask, AttentionSpec):  # FlexAttention block mask, context-parallel ring
            out = mask.attend(q, k, v, dropout_p=dropout_p)  # [B,H,S,hd]
            return self.output_proj(out.transpose(1, 2).reshape(b, s, -1))
        is_causal = mask is None and self.kv_cache is None
        attn_mask = None if mask is None else mask[:, None, :, :]  # [B,1,S,S_kv]
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            enable_gqa=q.shape[1] != k.shape[1],
        )  # [B,H,S,hd]
        out = out.transpose(1, 2).reshape(b, s, -1)  # [B,S,H*hd]
        return self.output_proj(out)
