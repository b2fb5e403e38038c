"""Llama 3 / 3.1 / 3.2 / 3.3: GQA, RoPE theta 500k with the Llama-3 frequency scaling, vocab 128,256.

Particular to the family: the `rope_scaling` knob (None is Llama 3.0; 3.1/3.3 scale by 8, 3.2 by
32), a 128k context, and tied embeddings for the 3.2 sizes. `FAMILY` below makes
`llama3(**sizes)`, `lora_llama3(**lora, **sizes)` and, for each of `SIZES`, `<size>()`,
`lora_<size>` and `qlora_<size>` (see `engine.models._decoder_builder.family_builders`).

Launch-time use: `_component_: engine.models.llama3.llama3_2_1b` (or `lora_llama3_2_1b`, `qlora_...`).
"""

from __future__ import annotations

from engine.models._decoder_builder import Family, family_builders
from engine.modules.rotary import Llama3RopeScaling

SCALING_3_1 = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
SCALING_3_2 = Llama3RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0)

SIZES = {
    "llama3_8b": dict(num_layers=32, num_heads=32, num_kv_heads=8, embed_dim=4096,
                      intermediate_dim=14336, max_seq_len=8192),
    "llama3_1_8b": dict(num_layers=32, num_heads=32, num_kv_heads=8, embed_dim=4096,
                        intermediate_dim=14336, rope_scaling=SCALING_3_1),
    "llama3_1_70b": dict(num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192,
                         intermediate_dim=28672, rope_scaling=SCALING_3_1),
    "llama3_2_1b": dict(num_layers=16, num_heads=32, num_kv_heads=8, embed_dim=2048,
                        intermediate_dim=8192, rope_scaling=SCALING_3_2, tie_word_embeddings=True),
    "llama3_2_3b": dict(num_layers=28, num_heads=24, num_kv_heads=8, embed_dim=3072,
                        intermediate_dim=8192, rope_scaling=SCALING_3_2, tie_word_embeddings=True),
    "llama3_3_70b": dict(num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192,
                         intermediate_dim=28672, rope_scaling=SCALING_3_1),
    # Tests: 2 layers, 64 dims, scaled RoPE so the Llama-3 schedule is exercised.
    "llama3_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64,
                        intermediate_dim=128, max_seq_len=256,
                        rope_scaling=Llama3RopeScaling(factor=8.0, original_max_position_embeddings=64)),
}  # fmt: skip

FAMILY = Family(
    "llama3", __name__,
    "A Llama-3 decoder from its sizes. `rope_scaling=None` is Llama 3.0 (no scaling); "
    "`lora` adds adapters (the `lora_llama3` builder fills it).",
    defaults=dict(vocab_size=128_256, max_seq_len=131_072, norm_eps=1e-5, rope_base=500_000.0, rope_scaling=None),
    sizes=SIZES,
)  # fmt: skip
globals().update(family_builders(FAMILY))
