"""FlexAttention for packed batches: a block mask from `document_ids`, not a dense `[B,S,S]` mask.

The decoder uses it for packed batches on CUDA (`TransformerDecoder.attention_backend = "auto"`):
the block mask records which 128 x 128 tiles are empty, full or partial, so attention skips the empty
ones (most of the matrix for short documents) and never materialises `[B,S,S]`; `flex_attention` is
compiled once per process (a Triton kernel). The CPU keeps the dense-mask SDPA path: PyTorch's
FlexAttention has no CPU backward, so on CPU a `FlexDocumentMask` computes its forward with
FlexAttention only when no input needs a gradient and otherwise falls back to SDPA on the same
mask (`dense()`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from engine.modules.attention_masks import AttentionSpec


@functools.cache
def flex_attention_available() -> bool:
    """Whether this torch ships FlexAttention (probed once, lazily)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _document_mask_mod(document_ids: torch.Tensor, sliding_window: int | None):
    """`mask_mod(b, h, q, kv)`: same document and causal (and within the window)."""

    def causal_same_document(b, h, q_idx, kv_idx):
        keep = (document_ids[b, q_idx] == document_ids[b, kv_idx]) & (kv_idx <= q_idx)
        if sliding_window is not None:
            keep = keep & (q_idx - kv_idx < sliding_window)
        return keep

    return causal_same_document


class FlexDocumentMask(AttentionSpec):
    """Block-causal attention over packed documents, as a FlexAttention `BlockMask`.

    Args:
        document_ids: `[B,S]` long, the document of each token (packing).
        sliding_window: Mistral-style window, or None.
    """

    def __init__(self, document_ids: torch.Tensor, sliding_window: int | None = None) -> None:
        from torch.nn.attention.flex_attention import create_block_mask

        self.document_ids = document_ids
        self.sliding_window = sliding_window
        b, s = document_ids.shape
        self.mask_mod = _document_mask_mod(document_ids, sliding_window)
        self.block_mask = create_block_mask(
            self.mask_mod, B=b, H=None, Q_LEN=s, KV_LEN=s, device=document_ids.device
        )

    def dense(self) -> torch.Tensor:
        """The same mask as a dense `[B,S,S]` bool tensor (the CPU fallback, and tests)."""
        from torch.nn.attention.flex_attention import create_mask

        b, s = self.document_ids.shape
        return create_mask(self.mask_mod, b, None, s, s, device=self.document_ids.device)[:, 0]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float) -> torch.Tensor:
        gqa = q.shape[1] != k.shape[1]
        grad = q.requires_grad or k.requires_grad or v.requires_grad
        if dropout_p > 0.0 or (q.device.type == "cpu" and grad):
            # FlexAttention has neither attention dropout nor a CPU backward: same mask, dense SDPA.
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=self.dense()[:, None], dropout_p=dropout_p, enable_gqa=gqa
            )
        if q.device.type == "cuda":
            return _compiled_flex()(q, k, v, block_mask=self.block_mask, enable_gqa=gqa)
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v, block_mask=self.block_mask, enable_gqa=gqa)
