"""Mistral 7B: GQA (8 KV heads); v0.1 uses a 4096-token sliding window, v0.3 a 32,768 vocab and theta 1M.

Launch-time use: `_component_: engine.models.mistral.mistral_7b` (or `lora_mistral_7b`, `qlora_mistral_7b`).
"""

from __future__ import annotations

from engine.models._decoder_builder import LoRASettings, build_decoder, forward_signature, lora_preset
from engine.modules.transformer import TransformerDecoder


def mistral(
    *,
    vocab_size: int = 32_000,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int = 32768,
    head_dim: int | None = None,
    norm_eps: float = 1e-5,
    rope_base: float = 10_000.0,
    tie_word_embeddings: bool = False,
    sliding_window: int | None = None,
    attn_dropout: float = 0.0,
    lora: LoRASettings | None = None,
) -> TransformerDecoder:
    """A Mistral decoder from its sizes; `sliding_window` limits how far back a token attends."""
    return build_decoder(**locals())


def lora_mistral(
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
    """`mistral(**model_kwargs)` with LoRA/DoRA adapters (QLoRA when `quantize_base`)."""
    lora = LoRASettings(
        tuple(lora_attn_modules), apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha,
        lora_dropout, quantize_base, use_dora,
    )  # fmt: skip
    return mistral(**model_kwargs, lora=lora)


lora_mistral.__signature__ = forward_signature(lora_mistral, mistral)


SIZES = {
    "mistral_7b": dict(num_layers=32, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=14336, sliding_window=4096),
    "mistral_7b_v0_3": dict(vocab_size=32768, num_layers=32, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=14336, rope_base=1_000_000.0),
    "mistral_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=128, max_seq_len=256, sliding_window=8),
}  # fmt: skip


def mistral_7b() -> TransformerDecoder:
    return mistral(**SIZES["mistral_7b"])


def mistral_7b_v0_3() -> TransformerDecoder:
    return mistral(**SIZES["mistral_7b_v0_3"])


def mistral_tiny() -> TransformerDecoder:
    return mistral(**SIZES["mistral_tiny"])


lora_mistral_7b = lora_preset(lora_mistral, "lora_mistral_7b", __name__, **SIZES["mistral_7b"])
lora_mistral_7b_v0_3 = lora_preset(lora_mistral, "lora_mistral_7b_v0_3", __name__, **SIZES["mistral_7b_v0_3"])
lora_mistral_tiny = lora_preset(lora_mistral, "lora_mistral_tiny", __name__, **SIZES["mistral_tiny"])
qlora_mistral_7b = lora_preset(
    lora_mistral, "qlora_mistral_7b", __name__, **SIZES["mistral_7b"], quantize_base=True
)
qlora_mistral_7b_v0_3 = lora_preset(
    lora_mistral, "qlora_mistral_7b_v0_3", __name__, **SIZES["mistral_7b_v0_3"], quantize_base=True
)
