"""Llama 3 / 3.1 / 3.2 / 3.3: GQA, RoPE theta 500k with the Llama-3 frequency scaling, vocab 128,256.

Launch-time use: `_component_: engine.models.llama3.llama3_2_1b` (or `lora_llama3_2_1b`, `qlora_...`).
"""

from __future__ import annotations

from engine.models._decoder_builder import LoRASettings, build_decoder, forward_signature, lora_preset
from engine.modules.rotary import Llama3RopeScaling
from engine.modules.transformer import TransformerDecoder


def llama3(
    *,
    vocab_size: int = 128_256,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int = 131_072,
    head_dim: int | None = None,
    norm_eps: float = 1e-5,
    rope_base: float = 500_000.0,
    rope_scaling: Llama3RopeScaling | None = None,
    tie_word_embeddings: bool = False,
    attn_dropout: float = 0.0,
    lora: LoRASettings | None = None,
) -> TransformerDecoder:
    """A Llama-3 decoder from its sizes. `rope_scaling=None` is Llama 3.0 (no scaling);
    `lora` adds adapters (the `lora_llama3` builder fills it)."""
    return build_decoder(**locals())


def lora_llama3(
    *,
    lora_attn_modules: tuple[str, ...] = ("q_proj", "v_proj"),
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    lora_dropout: float = 0.0,
    quantize_base: bool = False,
    use_dora: bool = False,
    **model_kwargs,
) -> TransformerDecoder:
    """`llama3(**model_kwargs)` with LoRA/DoRA adapters (QLoRA when `quantize_base`)."""
    lora = LoRASettings(
        tuple(lora_attn_modules), apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha,
        lora_dropout, quantize_base, use_dora,
    )  # fmt: skip
    return llama3(**model_kwargs, lora=lora)


lora_llama3.__signature__ = forward_signature(lora_llama3, llama3)


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


def llama3_8b() -> TransformerDecoder:
    return llama3(**SIZES["llama3_8b"])


def llama3_1_8b() -> TransformerDecoder:
    return llama3(**SIZES["llama3_1_8b"])


def llama3_1_70b() -> TransformerDecoder:
    return llama3(**SIZES["llama3_1_70b"])


def llama3_2_1b() -> TransformerDecoder:
    return llama3(**SIZES["llama3_2_1b"])


def llama3_2_3b() -> TransformerDecoder:
    return llama3(**SIZES["llama3_2_3b"])


def llama3_3_70b() -> TransformerDecoder:
    return llama3(**SIZES["llama3_3_70b"])


def llama3_tiny() -> TransformerDecoder:
    return llama3(**SIZES["llama3_tiny"])


lora_llama3_8b = lora_preset(lora_llama3, "lora_llama3_8b", __name__, **SIZES["llama3_8b"])
lora_llama3_1_8b = lora_preset(lora_llama3, "lora_llama3_1_8b", __name__, **SIZES["llama3_1_8b"])
lora_llama3_1_70b = lora_preset(lora_llama3, "lora_llama3_1_70b", __name__, **SIZES["llama3_1_70b"])
lora_llama3_2_1b = lora_preset(lora_llama3, "lora_llama3_2_1b", __name__, **SIZES["llama3_2_1b"])
lora_llama3_2_3b = lora_preset(lora_llama3, "lora_llama3_2_3b", __name__, **SIZES["llama3_2_3b"])
lora_llama3_3_70b = lora_preset(lora_llama3, "lora_llama3_3_70b", __name__, **SIZES["llama3_3_70b"])
lora_llama3_tiny = lora_preset(lora_llama3, "lora_llama3_tiny", __name__, **SIZES["llama3_tiny"])
qlora_llama3_8b = lora_preset(
    lora_llama3, "qlora_llama3_8b", __name__, **SIZES["llama3_8b"], quantize_base=True
)
qlora_llama3_1_8b = lora_preset(
    lora_llama3, "qlora_llama3_1_8b", __name__, **SIZES["llama3_1_8b"], quantize_base=True
)
qlora_llama3_1_70b = lora_preset(
    lora_llama3, "qlora_llama3_1_70b", __name__, **SIZES["llama3_1_70b"], quantize_base=True
)
qlora_llama3_2_1b = lora_preset(
    lora_llama3, "qlora_llama3_2_1b", __name__, **SIZES["llama3_2_1b"], quantize_base=True
)
qlora_llama3_2_3b = lora_preset(
    lora_llama3, "qlora_llama3_2_3b", __name__, **SIZES["llama3_2_3b"], quantize_base=True
)
qlora_llama3_3_70b = lora_preset(
    lora_llama3, "qlora_llama3_3_70b", __name__, **SIZES["llama3_3_70b"], quantize_base=True
)
