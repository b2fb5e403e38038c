"""Llama 2: multi-head (7B/13B) and grouped-query (70B) attention, RoPE theta 10k, vocab 32k.

Particular to the family: untied output, no biases, no RoPE scaling, a 4096-token context.
`FAMILY` below makes `llama2(**sizes)`, `lora_llama2(**lora, **sizes)` and, for each of `SIZES`,
`<size>()`, `lora_<size>` and `qlora_<size>` (see `engine.models._decoder_builder.family_builders`).

Launch-time use: `_component_: engine.models.llama2.llama2_7b` (or `lora_llama2_7b`, `qlora_llama2_7b`).
"""

from __future__ import annotations

from engine.models._decoder_builder import Family, family_builders

SIZES = {
    "llama2_7b": dict(num_layers=32, num_heads=32, num_kv_heads=32, embed_dim=4096, intermediate_dim=11008),
    "llama2_13b": dict(num_layers=40, num_heads=40, num_kv_heads=40, embed_dim=5120, intermediate_dim=13824),
    "llama2_70b": dict(num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=28672),
    "llama2_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=4, embed_dim=64, intermediate_dim=128, max_seq_len=256),
}  # fmt: skip

FAMILY = Family(
    "llama2", __name__, "A Llama-2 decoder from its sizes (untied output, no biases).",
    defaults=dict(vocab_size=32_000, max_seq_len=4096, norm_eps=1e-5, rope_base=10_000.0),
    sizes=SIZES,
)  # fmt: skip
globals().update(family_builders(FAMILY))
