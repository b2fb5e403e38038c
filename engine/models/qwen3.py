"""Qwen3 (dense): GQA with per-head RMSNorm on queries and keys, head_dim 128, RoPE theta 1M.

Launch-time use: `_component_: engine.models.qwen3.qwen3_0_6b` (or `lora_qwen3_0_6b`, `qlora_qwen3_0_6b`).
"""

from __future__ import annotations

from engine.models._decoder_builder import LoRASettings, build_decoder, forward_signature, lora_preset
from engine.modules.transformer import TransformerDecoder


def qwen3(
    *,
    vocab_size: int = 151_936,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int = 40960,
    head_dim: int | None = 128,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
    attn_dropout: float = 0.0,
    lora: LoRASettings | None = None,
) -> TransformerDecoder:
    """A Qwen3 decoder from its sizes (q/k RMSNorm always on; head_dim need not be embed_dim // heads)."""
    return build_decoder(**locals(), qk_norm=True)


def lora_qwen3(
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
    """`qwen3(**model_kwargs)` with LoRA/DoRA adapters (QLoRA when `quantize_base`)."""
    lora = LoRASettings(
        tuple(lora_attn_modules), apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha,
        lora_dropout, quantize_base, use_dora,
    )  # fmt: skip
    return qwen3(**model_kwargs, lora=lora)


lora_qwen3.__signature__ = forward_signature(lora_qwen3, qwen3)


SIZES = {
    "qwen3_0_6b": dict(num_layers=28, num_heads=16, num_kv_heads=8, embed_dim=1024, intermediate_dim=3072, tie_word_embeddings=True),
    "qwen3_1_7b": dict(num_layers=28, num_heads=16, num_kv_heads=8, embed_dim=2048, intermediate_dim=6144, tie_word_embeddings=True),
    "qwen3_4b": dict(num_layers=36, num_heads=32, num_kv_heads=8, embed_dim=2560, intermediate_dim=9728, tie_word_embeddings=True),
    "qwen3_8b": dict(num_layers=36, num_heads=32, num_kv_heads=8, embed_dim=4096, intermediate_dim=12288),
    "qwen3_14b": dict(num_layers=40, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=17408),
    "qwen3_32b": dict(num_layers=64, num_heads=64, num_kv_heads=8, embed_dim=5120, intermediate_dim=25600),
    "qwen3_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=128, max_seq_len=256, head_dim=32, tie_word_embeddings=True),
}  # fmt: skip


def qwen3_0_6b() -> TransformerDecoder:
    return qwen3(**SIZES["qwen3_0_6b"])


def qwen3_1_7b() -> TransformerDecoder:
    return qwen3(**SIZES["qwen3_1_7b"])


def qwen3_4b() -> TransformerDecoder:
    return qwen3(**SIZES["qwen3_4b"])


def qwen3_8b() -> TransformerDecoder:
    return qwen3(**SIZES["qwen3_8b"])


def qwen3_14b() -> TransformerDecoder:
    return qwen3(**SIZES["qwen3_14b"])


def qwen3_32b() -> TransformerDecoder:
    return qwen3(**SIZES["qwen3_32b"])


def qwen3_tiny() -> TransformerDecoder:
    return qwen3(**SIZES["qwen3_tiny"])


lora_qwen3_0_6b = lora_preset(lora_qwen3, "lora_qwen3_0_6b", __name__, **SIZES["qwen3_0_6b"])
lora_qwen3_1_7b = lora_preset(lora_qwen3, "lora_qwen3_1_7b", __name__, **SIZES["qwen3_1_7b"])
lora_qwen3_4b = lora_preset(lora_qwen3, "lora_qwen3_4b", __name__, **SIZES["qwen3_4b"])
lora_qwen3_8b = lora_preset(lora_qwen3, "lora_qwen3_8b", __name__, **SIZES["qwen3_8b"])
lora_qwen3_14b = lora_preset(lora_qwen3, "lora_qwen3_14b", __name__, **SIZES["qwen3_14b"])
lora_qwen3_32b = lora_preset(lora_qwen3, "lora_qwen3_32b", __name__, **SIZES["qwen3_32b"])
lora_qwen3_tiny = lora_preset(lora_qwen3, "lora_qwen3_tiny", __name__, **SIZES["qwen3_tiny"])
qlora_qwen3_0_6b = lora_preset(
    lora_qwen3, "qlora_qwen3_0_6b", __name__, **SIZES["qwen3_0_6b"], quantize_base=True
)
qlora_qwen3_1_7b = lora_preset(
    lora_qwen3, "qlora_qwen3_1_7b", __name__, **SIZES["qwen3_1_7b"], quantize_base=True
)
qlora_qwen3_4b = lora_preset(lora_qwen3, "qlora_qwen3_4b", __name__, **SIZES["qwen3_4b"], quantize_base=True)
qlora_qwen3_8b = lora_preset(lora_qwen3, "qlora_qwen3_8b", __name__, **SIZES["qwen3_8b"], quantize_base=True)
qlora_qwen3_14b = lora_preset(
    lora_qwen3, "qlora_qwen3_14b", __name__, **SIZES["qwen3_14b"], quantize_base=True
)
qlora_qwen3_32b = lora_preset(
    lora_qwen3, "qlora_qwen3_32b", __name__, **SIZES["qwen3_32b"], quantize_base=True
)
