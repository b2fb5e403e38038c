"""Mixtral: Mistral attention (GQA, 8 KV heads, theta 1M) with every MLP a top-2 mixture of 8 experts.

Particular to the family: the router knobs (`num_experts`, `num_experts_per_tok`, the two
auxiliary-loss weights; the top-k weights are always renormalised), `intermediate_dim` as each
expert's hidden size, and Mistral's `sliding_window`. `FAMILY` below makes `mixtral(**sizes)`,
`lora_mixtral(**lora, **sizes)` (adapters on attention and, by choice, on every expert) and, for
each of `SIZES`, `<size>()`, `lora_<size>`, and `qlora_mixtral_8x7b` (see
`engine.models._decoder_builder.family_builders`).

Launch-time use: `_component_: engine.models.mixtral.mixtral_8x7b` (or `lora_mixtral_8x7b`,
`qlora_mixtral_8x7b`: NF4 attention; experts stay in the base dtype).
"""

from __future__ import annotations

from engine.models._decoder_builder import Family, family_builders

SIZES = {
    "mixtral_8x7b": dict(num_layers=32, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=14336),
    "mixtral_8x22b": dict(vocab_size=32768, num_layers=56, num_heads=48, num_kv_heads=8, embed_dim=6144, intermediate_dim=16384, max_seq_len=65536),
    "mixtral_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=32, num_experts=4, max_seq_len=256),
}  # fmt: skip

FAMILY = Family(
    "mixtral", __name__,
    "A Mixtral decoder from its sizes (`intermediate_dim` is each expert's hidden size; the top-k "
    "weights are always renormalised).",
    defaults=dict(vocab_size=32_000, max_seq_len=32768, norm_eps=1e-5, rope_base=1_000_000.0, sliding_window=None),
    moe=dict(num_experts=8, num_experts_per_tok=2, router_aux_loss_coef=0.001, router_z_loss_coef=0.0),
    sizes=SIZES,
    qlora=("mixtral_8x7b",),
)  # fmt: skip
globals().update(family_builders(FAMILY))
