"""Phi-3 / Phi-3.5 / Phi-4 (Hugging Face `Phi3ForCausalLM`): a Llama-shaped decoder with fused projections.

Particular to the family: q, k and v are one `qkv_proj` and the MLP's gate and up one `gate_up_proj`
(gate first), kept fused here so the state dict has the checkpoint's keys and LoRA puts one adapter on
`qkv_proj` as PEFT does (fixed, not a knob); a sliding attention window on the Phi-3 4k checkpoints
(2047); LongRoPE (`engine.modules.rope_scaling.LongRopeScaling`) on the 128k / 3.5 / 4-mini ones and a
partial rotary dimension on Phi-4-mini (`partial_rotary_factor`). The LongRoPE checkpoints carry their
per-frequency factors in config.json: load them with `from_pretrained`, or give `rope_scaling` in a
config. Phi-4 (14B) is this architecture with a 100k vocabulary, RoPE theta 250k and a 16k context.
`FAMILY` below makes `phi3(**sizes)`, `lora_phi3(**lora, **sizes)` and, for each of `SIZES`,
`<size>()`, `lora_<size>` and `qlora_<size>` (see `engine.models._decoder_builder.family_builders`).

Launch-time use: `_component_: engine.models.phi3.phi3_mini_4k` (or `lora_phi4_14b`, `qlora_phi4_14b`).
"""

from __future__ import annotations

from engine.models._decoder_builder import Family, family_builders

SIZES = {
    # microsoft/Phi-3-mini-4k-instruct (3.8B)
    "phi3_mini_4k": dict(num_layers=32, num_heads=32, num_kv_heads=32, embed_dim=3072, intermediate_dim=8192, sliding_window=2047),
    # microsoft/Phi-3-medium-4k-instruct (14B)
    "phi3_medium_4k": dict(num_layers=40, num_heads=40, num_kv_heads=10, embed_dim=5120, intermediate_dim=17920, sliding_window=2047),
    # microsoft/phi-4 (14B)
    "phi4_14b": dict(vocab_size=100_352, num_layers=40, num_heads=40, num_kv_heads=10, embed_dim=5120, intermediate_dim=17920, max_seq_len=16384, rope_base=250_000.0),
    # Tests: 2 layers, 64 dims, a sliding window shorter than the test sequences.
    "phi3_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=128, max_seq_len=256, sliding_window=16),
}  # fmt: skip

FAMILY = Family(
    "phi3", __name__,
    "A Phi-3 / Phi-4 decoder from its sizes (qkv_proj and gate_up_proj fused; `lora_attn_modules` takes "
    "qkv_proj and output_proj).",
    defaults=dict(vocab_size=32_064, max_seq_len=4096, norm_eps=1e-5, rope_base=10_000.0, sliding_window=None,
                  partial_rotary_factor=1.0),
    fixed=dict(fused_projections=True),
    sizes=SIZES,
)  # fmt: skip
globals().update(family_builders(FAMILY))
