"""Qwen2 / Qwen2.5: GQA with biased q/k/v projections, RoPE theta 1M, vocab 151,936 / 152,064.

Particular to the family: q/k/v biases always on (fixed, not a knob), RMSNorm eps 1e-6, and tied
embeddings for the small sizes. `FAMILY` below makes `qwen2(**sizes)`, `lora_qwen2(**lora,
**sizes)` and, for each of `SIZES`, `<size>()`, `lora_<size>` and `qlora_<size>` (see
`engine.models._decoder_builder.family_builders`).

Launch-time use: `_component_: engine.models.qwen2.qwen2_5_0_5b` (or `lora_qwen2_5_0_5b`, `qlora_qwen2_5_0_5b`).
"""

from __future__ import annotations

from engine.models._decoder_builder import Family, family_builders

SIZES = {
    "qwen2_0_5b": dict(num_layers=24, num_heads=14, num_kv_heads=2, embed_dim=896, intermediate_dim=4864, max_seq_len=131072, tie_word_embeddings=True),
    "qwen2_1_5b": dict(num_layers=28, num_heads=12, num_kv_heads=2, embed_dim=1536, intermediate_dim=8960, max_seq_len=131072, tie_word_embeddings=True),
    "qwen2_7b": dict(vocab_size=152064, num_layers=28, num_heads=28, num_kv_heads=4, embed_dim=3584, intermediate_dim=18944, max_seq_len=131072),
    "qwen2_72b": dict(vocab_size=152064, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=29568, max_seq_len=131072),
    "qwen2_5_0_5b": dict(num_layers=24, num_heads=14, num_kv_heads=2, embed_dim=896, intermediate_dim=4864, tie_word_embeddings=True),
    "qwen2_5_1_5b": dict(num_layers=28, num_heads=12, num_kv_heads=2, embed_dim=1536, intermediate_dim=8960, tie_word_embeddings=True),
    "qwen2_5_3b": dict(num_layers=36, num_heads=16, num_kv_heads=2, embed_dim=2048, intermediate_dim=11008, tie_word_embeddings=True),
    "qwen2_5_7b": dict(vocab_size=152064, num_layers=28, num_heads=28, num_kv_heads=4, embed_dim=3584, intermediate_dim=18944),
    "qwen2_5_14b": dict(vocab_size=152064, num_layers=48, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=13824),
    "qwen2_5_32b": dict(vocab_size=152064, num_layers=64, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=27648),
    "qwen2_5_72b": dict(vocab_size=152064, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=29568),
    "qwen2_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=128, max_seq_len=256, tie_word_embeddings=True),
}  # fmt: skip

FAMILY = Family(
    "qwen2", __name__,
    "A Qwen2/Qwen2.5 decoder from its sizes (q/k/v biases always on; small sizes tie embeddings).",
    defaults=dict(vocab_size=151_936, max_seq_len=32768, norm_eps=1e-6, rope_base=1_000_000.0),
    fixed=dict(attn_bias=True),
    sizes=SIZES,
)  # fmt: skip
globals().update(family_builders(FAMILY))
