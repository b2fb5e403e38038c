"""Pre-norm decoder block and the decoder-only transformer used by every model family."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.modules.attention import GroupedQueryAttention
from engine.modules.attention_masks import (
    AttentionSpec,
    block_causal_mask,
    cache_causal_mask,
    causal_mask,
    sliding_window_mask,
)
from engine.modules.flex_attention import FlexDocumentMask, flex_attention_available
from engine.modules.neftune import add_neftune_noise
from engine.modules.rotary import RotaryEmbedding


def _use_flex(backend: str, device: torch.device) -> bool:
    if backend == "flex":
        return flex_attention_available()
    return backend == "auto" and device.type == "cuda" and flex_attention_available()


class TransformerBlock(nn.Module):
    """`x + attn(sa_norm(x))`, then `h + mlp(mlp_norm(h))`.

    Args:
        attn (GroupedQueryAttention), mlp (nn.Module), sa_norm (nn.Module), mlp_norm (nn.Module).
    """

    def __init__(
        self, *, attn: GroupedQueryAttention, mlp: nn.Module, sa_norm: nn.Module, mlp_norm: nn.Module
    ) -> None:
        super().__init__()
        self.attn = attn
        self.mlp = mlp
        self.sa_norm = sa_norm
        self.mlp_norm = mlp_norm

    def forward(
        self,
        x: torch.Tensor,
        *,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # x: [B,S,D]
        h = x + self.attn(self.sa_norm(x), rope=rope, mask=mask, input_pos=input_pos)
        return h + self.mlp(self.mlp_norm(h))


class TransformerDecoder(nn.Module):
    """Token embedding, `layers`, final norm and an output projection (tied or not).

    Args:
        tok_embeddings (nn.Embedding): `[V, D]`.
        layers (list[TransformerBlock]): stored as `self.layers` (an `nn.ModuleList`).
        norm (nn.Module): final norm.
        output (nn.Module | None): `D -> V` projection; None ties it to `tok_embeddings.weight`.
        rope (RotaryEmbedding): shared RoPE tables.
        max_seq_len (int): longest sequence (RoPE table length, default cache length).
        sliding_window (int | None): Mistral-style attention window; None for full attention.

    `forward(tokens [B,S] long, *, position_ids [B,S] | None, document_ids [B,S] | None,
    mask [B,S,S_kv] bool | None, input_pos [S] | None) -> logits [B,S,V]` (in the weights' dtype).
    Position ids default to `0..S-1` (or `input_pos` when caching); with packing the caller passes
    ids that restart per document. `document_ids` makes attention block-causal (a FlexAttention
    block mask on CUDA, a dense `[B,S,S]` mask on CPU: `attention_backend` "auto" | "flex" | "sdpa").
    An explicit `mask` wins over `document_ids`. With `neftune_alpha > 0` (set by the recipes'
    `neftune_alpha` key) the embeddings get NEFTune's noise in training mode only. Under context parallelism (`context_parallel`, set
    by `parallelize`) the tokens are this rank's slice and `position_ids` are required. With KV caches (`setup_caches`), `input_pos` is required.
    """

    def __init__(
        self,
        *,
        tok_embeddings: nn.Embedding,
        layers: list[nn.Module],
        norm: nn.Module,
        output: nn.Module | None,
        rope: RotaryEmbedding,
        max_seq_len: int,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        self.tok_embeddings = tok_embeddings
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.output = output
        self.rope = rope
        self.max_seq_len = max_seq_len
        self.sliding_window = sliding_window
        self._cache_len: int | None = None
        # Packed batches: "auto" = FlexAttention block mask on CUDA, dense mask on CPU; "sdpa" = dense.
        self.attention_backend = "auto"
        # Set by `parallelize` when cp > 1: builds the ring-attention mask of each forward.
        self.context_parallel = None
        # NEFTune (`engine.modules.neftune`): > 0 adds noise to the input embeddings in training mode.
        self.neftune_alpha = 0.0

    # ---- output projection -------------------------------------------------------------
    @property
    def tied(self) -> bool:
        return self.output is None

    @property
    def output_weight(self) -> torch.Tensor:
        """The `[V,D]` weight applied to final hidden states (LoRA adapters merged in, if any)."""
        if self.output is None:
            return self.tok_embeddings.weight
        merged = getattr(self.output, "merged_weight", None)
        return merged() if callable(merged) else self.output.weight

    # ---- KV caches ----------------------------------------------------------------------
    def setup_caches(
        self, batch_size: int, max_seq_len: int | None = None, dtype: torch.dtype | None = None
    ) -> None:
        """Allocate a KV cache of `max_seq_len` slots (default the model's) in every layer."""
        length = max_seq_len or self.max_seq_len
        if length > self.max_seq_len:
            raise ValueError(f"cache length {length} exceeds the model's max_seq_len {self.max_seq_len}")
        dtype = dtype or self.tok_embeddings.weight.dtype
        device = self.tok_embeddings.weight.device
        for layer in self.layers:
            layer.attn.setup_cache(batch_size, length, dtype, device)
        self._cache_len = length

    def caches_are_enabled(self) -> bool:
        return self._cache_len is not None

    def reset_caches(self) -> None:
        for layer in self.layers:
            if layer.attn.kv_cache is not None:
                layer.attn.kv_cache.reset()

    def teardown_caches(self) -> None:
        for layer in self.layers:
            layer.attn.kv_cache = None
        self._cache_len = None

    # ---- forward --------------------------------------------------------------------------
    def _attention_mask(
        self,
        tokens: torch.Tensor,
        document_ids: torch.Tensor | None,
        mask: torch.Tensor | None,
        input_pos: torch.Tensor | None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor | AttentionSpec | None:
        b, s = tokens.shape
        if mask is None and self._cache_len is None:
            if self.context_parallel is not None:  # this rank's sequence slice: ring attention
                return self.context_parallel.mask(position_ids, document_ids, self.sliding_window)
            if document_ids is not None and _use_flex(self.attention_backend, tokens.device):
                return FlexDocumentMask(document_ids, self.sliding_window)
        if mask is None and document_ids is not None:
            mask = block_causal_mask(document_ids)  # [B,S,S]
        if mask is None and self._cache_len is not None:
            mask = cache_causal_mask(input_pos, self._cache_len).expand(b, s, self._cache_len)
        key_len = self._cache_len or s
        if self.sliding_window is not None and key_len > self.sliding_window:
            query_pos = input_pos if input_pos is not None else torch.arange(s, device=tokens.device)
            band = sliding_window_mask(query_pos, key_len, self.sliding_window)  # [S,S_kv]
            if mask is None:
                mask = causal_mask(s, tokens.device)
            mask = mask & band
        if mask is not None and mask.dim() == 2:
            mask = mask.expand(b, *mask.shape)
        return mask

    def forward_hidden(
        self,
        tokens: torch.Tensor,
        *,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states `[B,S,D]` (arguments as in `forward`)."""
        b, s = tokens.shape
        if self._cache_len is not None and input_pos is None:
            raise ValueError("KV caches are set up: pass input_pos (cache slots of these tokens)")
        if position_ids is None and self.context_parallel is not None:
            raise ValueError(
                "context parallelism: pass position_ids (the global positions of this rank's slice; "
                "engine.training.context_parallel.split_batch makes them)"
            )
        if position_ids is None:
            # [1,S]: one RoPE table row per position, broadcast over the batch
            base = input_pos if input_pos is not None else torch.arange(s, device=tokens.device)
            position_ids = base[None, :]
        h = self.tok_embeddings(tokens)  # [B,S,D]
        if self.training and self.neftune_alpha > 0:
            h = add_neftune_noise(h, self.neftune_alpha)
        rope = self.rope(position_ids, h.dtype)  # cos, sin: [B,S,hd]
        attn_mask = self._attention_mask(tokens, document_ids, mask, input_pos, position_ids)
        for layer in self.layers:
            h = layer(h, rope=rope, mask=attn_mask, input_pos=input_pos)
        return self.norm(h)

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = self.forward_hidden(
            tokens, position_ids=position_ids, document_ids=document_ids, mask=mask, input_pos=input_pos
        )
        if self.output is None:
            return F.linear(h, self.tok_embeddings.weight)  # [B,S,V]
        return self.output(h)
