"""Qwen3-MoE: Qwen3 attention (q/k RMSNorm, head_dim 128) with every MLP a top-8 mixture of 128 experts.

Launch-time use: `_component_: engine.models.qwen3_moe.qwen3_moe_30b_a3b` (or `lora_qwen3_moe_30b_a3b`,
`qlora_qwen3_moe_30b_a3b`: NF4 attention; experts stay in the base dtype).
"""

from __future__ import annotations

from engine.models._decoder_builder import LoRASettings, build_decoder, lora_preset, moe_lora_builder
from engine.modules.moe import MoESettings
from engine.modules.transformer import TransformerDecoder


def qwen3_moe(
    *,
    vocab_size: int = 151_936,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    moe_intermediate_dim: int,
    num_experts: int = 128,
    num_experts_per_tok: int = 8,
    norm_topk_prob: bool = True,
    router_aux_loss_coef: float = 0.001,
    router_z_loss_coef: float = 0.0,
    max_seq_len: int = 40960,
    head_dim: int | None = 128,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
    attn_dropout: float = 0.0,
    lora: LoRASettings | None = None,
) -> TransformerDecoder:
    """A Qwen3-MoE decoder from its sizes (`moe_intermediate_dim` is each expert's hidden size)."""
    moe = MoESettings(
        num_experts=num_experts,
        top_k=num_experts_per_tok,
        moe_intermediate_dim=moe_intermediate_dim,
        norm_topk_prob=norm_topk_prob,
        router_aux_loss_coef=router_aux_loss_coef,
        router_z_loss_coef=router_z_loss_coef,
        naming="qwen3_moe",
    )
    return build_decoder(
        vocab_size=vocab_size, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
        embed_dim=embed_dim, intermediate_dim=moe_intermediate_dim, max_seq_len=max_seq_len,
        head_dim=head_dim, norm_eps=norm_eps, rope_base=rope_base, qk_norm=True,
        tie_word_embeddings=tie_word_embeddings, attn_dropout=attn_dropout, moe=moe, lora=lora,
    )  # fmt: skip


lora_qwen3_moe = moe_lora_builder(qwen3_moe, "lora_qwen3_moe", __name__)


SIZES = {
    "qwen3_moe_30b_a3b": dict(num_layers=48, num_heads=32, num_kv_heads=4, embed_dim=2048, moe_intermediate_dim=768),
    "qwen3_moe_235b_a22b": dict(num_layers=94, num_heads=64, num_kv_heads=4, embed_dim=4096, moe_intermediate_dim=1536),
    "qwen3_moe_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, moe_intermediate_dim=32, num_experts=8, num_experts_per_tok=2, max_seq_len=256, head_dim=16),
}  # fmt: skip


def qwen3_moe_30b_a3b() -> TransformerDecoder:
    return qwen3_moe(**SIZES["qwen3_moe_30b_a3b"])


def qwen3_moe_235b_a22b() -> TransformerDecoder:
    return qwen3_moe(**SIZES["qwen3_moe_235b_a22b"])


def qwen3_moe_tiny() -> TransformerDecoder:
    return qwen3_moe(**SIZES["qwen3_moe_tiny"])


lora_qwen3_moe_30b_a3b = lora_preset(
    lora_qwen3_moe, "lora_qwen3_moe_30b_a3b", __name__, **SIZES["qwen3_moe_30b_a3b"]
)
lora_qwen3_moe_235b_a22b = lora_preset(
    lora_qwen3_moe, "lora_qwen3_moe_235b_a22b", __name__, **SIZES["qwen3_moe_235b_a22b"]
)
lora_qwen3_moe_tiny = lora_preset(lora_qwen3_moe, "lora_qwen3_moe_tiny", __name__, **SIZES["qwen3_moe_tiny"])
qlora_qwen3_moe_30b_a3b = lora_preset(
    lora_qwen3_moe, "qlora_qwen3_moe_30b_a3b", __name__, **SIZES["qwen3_moe_30b_a3b"], quantize_base=True
)
