"""Mixtral: Mistral attention (GQA, 8 KV heads, theta 1M) with every MLP a top-2 mixture of 8 experts.

Launch-time use: `_component_: engine.models.mixtral.mixtral_8x7b` (or `lora_mixtral_8x7b`,
`qlora_mixtral_8x7b`: NF4 attention; experts stay in the base dtype).
"""

from __future__ import annotations

from engine.models._decoder_builder import LoRASettings, build_decoder, lora_preset, moe_lora_builder
from engine.modules.moe import MoESettings
from engine.modules.transformer import TransformerDecoder


def mixtral(
    *,
    vocab_size: int = 32_000,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    num_experts: int = 8,
    num_experts_per_tok: int = 2,
    router_aux_loss_coef: float = 0.001,
    router_z_loss_coef: float = 0.0,
    max_seq_len: int = 32768,
    head_dim: int | None = None,
    norm_eps: float = 1e-5,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
    sliding_window: int | None = None,
    attn_dropout: float = 0.0,
    lora: LoRASettings | None = None,
) -> TransformerDecoder:
    """A Mixtral decoder from its sizes (`intermediate_dim` is each expert's hidden size; the top-k
    weights are always renormalised)."""
    moe = MoESettings(
        num_experts=num_experts,
        top_k=num_experts_per_tok,
        moe_intermediate_dim=intermediate_dim,
        norm_topk_prob=True,
        router_aux_loss_coef=router_aux_loss_coef,
        router_z_loss_coef=router_z_loss_coef,
        naming="mixtral",
    )
    return build_decoder(
        vocab_size=vocab_size, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
        embed_dim=embed_dim, intermediate_dim=intermediate_dim, max_seq_len=max_seq_len, head_dim=head_dim,
        norm_eps=norm_eps, rope_base=rope_base, tie_word_embeddings=tie_word_embeddings,
        sliding_window=sliding_window, attn_dropout=attn_dropout, moe=moe, lora=lora,
    )  # fmt: skip


lora_mixtral = moe_lora_builder(mixtral, "lora_mixtral", __name__)


SIZES = {
    "mixtral_8x7b": dict(num_layers=32, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=14336),
    "mixtral_8x22b": dict(vocab_size=32768, num_layers=56, num_heads=48, num_kv_heads=8, embed_dim=6144, intermediate_dim=16384, max_seq_len=65536),
    "mixtral_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=32, num_experts=4, max_seq_len=256),
}  # fmt: skip


def mixtral_8x7b() -> TransformerDecoder:
    return mixtral(**SIZES["mixtral_8x7b"])


def mixtral_8x22b() -> TransformerDecoder:
    return mixtral(**SIZES["mixtral_8x22b"])


def mixtral_tiny() -> TransformerDecoder:
    return mixtral(**SIZES["mixtral_tiny"])


lora_mixtral_8x7b = lora_preset(lora_mixtral, "lora_mixtral_8x7b", __name__, **SIZES["mixtral_8x7b"])
lora_mixtral_8x22b = lora_preset(lora_mixtral, "lora_mixtral_8x22b", __name__, **SIZES["mixtral_8x22b"])
lora_mixtral_tiny = lora_preset(lora_mixtral, "lora_mixtral_tiny", __name__, **SIZES["mixtral_tiny"])
qlora_mixtral_8x7b = lora_preset(
    lora_mixtral, "qlora_mixtral_8x7b", __name__, **SIZES["mixtral_8x7b"], quantize_base=True
)
