"""SmolLM2 (Llama architecture, tied embeddings, vocab 49,152): 135M, 360M, 1.7B.

Launch-time use: `_component_: engine.models.smollm2.smollm2_135m` (or `lora_smollm2_135m`, `qlora_smollm2_135m`).
"""

from __future__ import annotations

from engine.models._decoder_builder import LoRASettings, build_decoder, forward_signature, lora_preset
from engine.modules.transformer import TransformerDecoder


def smollm2(
    *,
    vocab_size: int = 49_152,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int = 8192,
    head_dim: int | None = None,
    norm_eps: float = 1e-5,
    rope_base: float = 100_000.0,
    tie_word_embeddings: bool = False,
    attn_dropout: float = 0.0,
    lora: LoRASettings | None = None,
) -> TransformerDecoder:
    """A SmolLM2 decoder from its sizes (a Llama decoder with SmolLM2 defaults)."""
    return build_decoder(**locals())


def lora_smollm2(
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
    """`smollm2(**model_kwargs)` with LoRA/DoRA adapters (QLoRA when `quantize_base`)."""
    lora = LoRASettings(
        tuple(lora_attn_modules), apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha,
        lora_dropout, quantize_base, use_dora,
    )  # fmt: skip
    return smollm2(**model_kwargs, lora=lora)


lora_smollm2.__signature__ = forward_signature(lora_smollm2, smollm2)


SIZES = {
    "smollm2_135m": dict(num_layers=30, num_heads=9, num_kv_heads=3, embed_dim=576, intermediate_dim=1536, tie_word_embeddings=True),
    "smollm2_360m": dict(num_layers=32, num_heads=15, num_kv_heads=5, embed_dim=960, intermediate_dim=2560, tie_word_embeddings=True),
    "smollm2_1_7b": dict(num_layers=24, num_heads=32, num_kv_heads=32, embed_dim=2048, intermediate_dim=8192, rope_base=130_000.0, tie_word_embeddings=True),
}  # fmt: skip


def smollm2_135m() -> TransformerDecoder:
    return smollm2(**SIZES["smollm2_135m"])


def smollm2_360m() -> TransformerDecoder:
    return smollm2(**SIZES["smollm2_360m"])


def smollm2_1_7b() -> TransformerDecoder:
    return smollm2(**SIZES["smollm2_1_7b"])


lora_smollm2_135m = lora_preset(lora_smollm2, "lora_smollm2_135m", __name__, **SIZES["smollm2_135m"])
lora_smollm2_360m = lora_preset(lora_smollm2, "lora_smollm2_360m", __name__, **SIZES["smollm2_360m"])
lora_smollm2_1_7b = lora_preset(lora_smollm2, "lora_smollm2_1_7b", __name__, **SIZES["smollm2_1_7b"])
qlora_smollm2_135m = lora_preset(
    lora_smollm2, "qlora_smollm2_135m", __name__, **SIZES["smollm2_135m"], quantize_base=True
)
qlora_smollm2_360m = lora_preset(
    lora_smollm2, "qlora_smollm2_360m", __name__, **SIZES["smollm2_360m"], quantize_base=True
)
qlora_smollm2_1_7b = lora_preset(
    lora_smollm2, "qlora_smollm2_1_7b", __name__, **SIZES["smollm2_1_7b"], quantize_base=True
)
