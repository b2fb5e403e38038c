"""Mistral 7B: GQA (8 KV heads); v0.1 uses a 4096-token sliding window, v0.3 a 32,768 vocab and theta 1M.

Particular to the family: the `sliding_window` knob (how far back a token attends; None is full
attention) and a 32k context. `FAMILY` below makes `mistral(**sizes)`, `lora_mistral(**lora,
**sizes)` and, for each of `SIZES`, `<size>()`, `lora_<size>` and `qlora_<size>` (see
`engine.models._decoder_builder.family_builders`).

Launch-time use: `_component_: engine.models.mistral.mistral_7b` (or `lora_mistral_7b`, `qlora_mistral_7b`).
"""

from __future__ import annotations

from engine.models._decoder_builder import Family, family_builders

SIZES = {
    "mistral_7b": dict(num_layers=32, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=14336, sliding_window=4096),
    "mistral_7b_v0_3": dict(vocab_size=32768, num_layers=32, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=14336, rope_base=1_000_000.0),
    "mistral_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=128, max_seq_len=256, sliding_window=8),
}  # fmt: skip

FAMILY = Family(
    "mistral", __name__,
    "A Mistral decoder from its sizes; `sliding_window` limits how far back a token attends.",
    defaults=dict(vocab_size=32_000, max_seq_len=32768, norm_eps=1e-5, rope_base=10_000.0, sliding_window=None),
    sizes=SIZES,
)  # fmt: skip
globals().update(family_builders(FAMILY))
