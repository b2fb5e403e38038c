"""Qwen3 (dense): GQA with per-head RMSNorm on queries and keys, head_dim 128, RoPE theta 1M.

Particular to the family: q/k RMSNorm always on (fixed, not a knob), `head_dim` 128 whatever
`embed_dim // num_heads` is, RMSNorm eps 1e-6, a 40k context. `FAMILY` below makes
`qwen3(**sizes)`, `lora_qwen3(**lora, **sizes)` and, for each of `SIZES`, `<size>()`,
`lora_<size>` and `qlora_<size>` (see `engine.models._decoder_builder.family_builders`).

Launch-time use: `_component_: engine.models.qwen3.qwen3_0_6b` (or `lora_qwen3_0_6b`, `qlora_qwen3_0_6b`).
"""

from __future__ import annotations

from engine.models._decoder_builder import Family, family_builders

SIZES = {
    "qwen3_0_6b": dict(num_layers=28, num_heads=16, num_kv_heads=8, embed_dim=1024, intermediate_dim=3072, tie_word_embeddings=True),
    "qwen3_1_7b": dict(num_layers=28, num_heads=16, num_kv_heads=8, embed_dim=2048, intermediate_dim=6144, tie_word_embeddings=True),
    "qwen3_4b": dict(num_layers=36, num_heads=32, num_kv_heads=8, embed_dim=2560, intermediate_dim=9728, tie_word_embeddings=True),
    "qwen3_8b": dict(num_layers=36, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=12288),
    "qwen3_14b": dict(num_layers=40, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=17408),
    "qwen3_32b": dict(num_layers=64, num_heads=64, num_kv_heads=8, embed_dim=5120, intermediate_dim=25600),
    "qwen3_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=128, max_seq_len=256, head_dim=32, tie_word_embeddings=True),
}  # fmt: skip

FAMILY = Family(
    "qwen3", __name__,
    "A Qwen3 decoder from its sizes (q/k RMSNorm always on; head_dim need not be embed_dim // heads).",
    defaults=dict(vocab_size=151_936, max_seq_len=40960, head_dim=128, norm_eps=1e-6, rope_base=1_000_000.0),
    fixed=dict(qk_norm=True),
    sizes=SIZES,
)  # fmt: skip
globals().update(family_builders(FAMILY))
