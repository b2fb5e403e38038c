"""Qwen3-MoE: Qwen3 attention (q/k RMSNorm, head_dim 128) with every MLP a top-8 mixture of 128 experts.

Particular to the family: Qwen3's fixed q/k RMSNorm and defaults, the router knobs
(`num_experts`, `num_experts_per_tok`, `norm_topk_prob`, the two auxiliary-loss weights), and
`moe_intermediate_dim` (each expert's hidden size) in place of `intermediate_dim`. `FAMILY` below
makes `qwen3_moe(**sizes)`, `lora_qwen3_moe(**lora, **sizes)` (adapters on attention and, by
choice, on every expert) and, for each of `SIZES`, `<size>()`, `lora_<size>`, and
`qlora_qwen3_moe_30b_a3b` (see `engine.models._decoder_builder.family_builders`).

Launch-time use: `_component_: engine.models.qwen3_moe.qwen3_moe_30b_a3b` (or `lora_qwen3_moe_30b_a3b`,
`qlora_qwen3_moe_30b_a3b`: NF4 attention; experts stay in the base dtype).
"""

from __future__ import annotations

from engine.models._decoder_builder import Family, family_builders

SIZES = {
    "qwen3_moe_30b_a3b": dict(num_layers=48, num_heads=32, num_kv_heads=4, embed_dim=2048, moe_intermediate_dim=768),
    "qwen3_moe_235b_a22b": dict(num_layers=94, num_heads=64, num_kv_heads=4, embed_dim=4096, moe_intermediate_dim=1536),
    "qwen3_moe_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, moe_intermediate_dim=32, num_experts=8, num_experts_per_tok=2, max_seq_len=256, head_dim=16),
}  # fmt: skip

FAMILY = Family(
    "qwen3_moe", __name__,
    "A Qwen3-MoE decoder from its sizes (`moe_intermediate_dim` is each expert's hidden size).",
    defaults=dict(vocab_size=151_936, max_seq_len=40960, head_dim=128, norm_eps=1e-6, rope_base=1_000_000.0),
    fixed=dict(qk_norm=True),
    moe=dict(num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, router_aux_loss_coef=0.001,
             router_z_loss_coef=0.0),
    expert_dim="moe_intermediate_dim",
    sizes=SIZES,
    qlora=("qwen3_moe_30b_a3b",),
)  # fmt: skip
globals().update(family_builders(FAMILY))
