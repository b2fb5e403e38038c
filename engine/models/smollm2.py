"""SmolLM2 (Llama architecture, tied embeddings, vocab 49,152): 135M, 360M, 1.7B.

Particular to the family: only its defaults (RoPE theta 100k, an 8k context; every preset ties
its embeddings). `FAMILY` below makes `smollm2(**sizes)`, `lora_smollm2(**lora, **sizes)` and,
for each of `SIZES`, `<size>()`, `lora_<size>` and `qlora_<size>` (see
`engine.models._decoder_builder.family_builders`).

Launch-time use: `_component_: engine.models.smollm2.smollm2_135m` (or `lora_smollm2_135m`, `qlora_smollm2_135m`).
"""

from __future__ import annotations

from engine.models._decoder_builder import Family, family_builders

SIZES = {
    "smollm2_135m": dict(num_layers=30, num_heads=9, num_kv_heads=3, embed_dim=576, intermediate_dim=1536, tie_word_embeddings=True),
    "smollm2_360m": dict(num_layers=32, num_heads=15, num_kv_heads=5, embed_dim=960, intermediate_dim=2560, tie_word_embeddings=True),
    "smollm2_1_7b": dict(num_layers=24, num_heads=32, num_kv_heads=32, embed_dim=2048, intermediate_dim=8192, rope_base=130_000.0, tie_word_embeddings=True),
}  # fmt: skip

FAMILY = Family(
    "smollm2", __name__, "A SmolLM2 decoder from its sizes (a Llama decoder with SmolLM2 defaults).",
    defaults=dict(vocab_size=49_152, max_seq_len=8192, norm_eps=1e-5, rope_base=100_000.0),
    sizes=SIZES,
)  # fmt: skip
globals().update(family_builders(FAMILY))
