"""Qwen2 / Qwen2.5: GQA with biased q/k/v projections, RoPE theta 1M, vocab 151,936 / 152,064.

Launch-time use: `_component_: engine.models.qwen2.qwen2_5_0_5b` (or `lora_qwen2_5_0_5b`, `qlora_qwen2_5_0_5b`).
"""

from __future__ import annotations

from engine.models._decoder_builder import LoRASettings, build_decoder, forward_signature, lora_preset
from engine.modules.transformer import TransformerDecoder


def qwen2(
    *,
    vocab_size: int = 151_936,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int = 32768,
    head_dim: int | None = None,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
    attn_dropout: float = 0.0,
    lora: LoRASettings | None = None,
) -> TransformerDecoder:
    """A Qwen2/Qwen2.5 decoder from its sizes (q/k/v biases always on; small sizes tie embeddings)."""
    return build_decoder(**locals(), attn_bias=True)


def lora_qwen2(
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
    """`qwen2(**model_kwargs)` with LoRA/DoRA adapters (QLoRA when `quantize_base`)."""
    lora = LoRASettings(
        tuple(lora_attn_modules), apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha,
        lora_dropout, quantize_base, use_dora,
    )  # fmt: skip
    return qwen2(**model_kwargs, lora=lora)


lora_qwen2.__signature__ = forward_signature(lora_qwen2, qwen2)


SIZES = {
    "qwen2_0_5b": dict(num_layers=24, num_heads=14, num_kv_heads=2, embed_dim=896, intermediate_dim=4864, max_seq_len=131072, tie_word_embeddings=True),
    "qwen2_1_5b": dict(num_layers=28, num_heads=12, num_kv_heads=2, embed_dim=1536, intermediate_dim=8960, max_seq_len=131072, tie_word_embeddings=True),
    "qwen2_7b": dict(vocab_size=152064, num_layers=28, num_heads=28, num_kv_heads=4, embed_dim=3584, intermediate_dim=18944, max_seq_len=131072),
    "qwen2_72b": dict(vocab_size=152064, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=29568, max_seq_len=131072),
    "qwen2_5_0_5b": dict(num_layers=24, num_heads=14, num_kv_heads=2, embed_dim=896, intermediate_dim=4864, tie_word_embeddings=True),
    "qwen2_5_1_5b": dict(num_layers=28, num_heads=12, num_kv_heads=2, embed_dim=1536, intermediate_dim=8960, tie_word_embeddings=True),
    "qwen2_5_3b": dict(num_layers=36, num_heads=16, num_kv_heads=2, embed_dim=2048, intermediate_dim=11008, tie_word_embeddings=True),
    "qwen2_5_7b": dict(vocab_size=152064, num_layers=28, num_heads=28, num_kv_heads=4, embed_dim=3584, intermediate_dim=18944),
    "qwen2_5_14b": dict(vocab_size=152064, num_layers=48, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=13824),
    "qwen2_5_32b": dict(vocab_size=152064, num_layers=64, num_heads=40, num_kv_heads=8, embed_dim=5120, intermediate_dim=27648),
    "qwen2_5_72b": dict(vocab_size=152064, num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=29568),
    "qwen2_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=128, max_seq_len=256, tie_word_embeddings=True),
}  # fmt: skip


def qwen2_0_5b() -> TransformerDecoder:
    return qwen2(**SIZES["qwen2_0_5b"])


def qwen2_1_5b() -> TransformerDecoder:
    return qwen2(**SIZES["qwen2_1_5b"])


def qwen2_7b() -> TransformerDecoder:
    return qwen2(**SIZES["qwen2_7b"])


def qwen2_72b() -> TransformerDecoder:
    return qwen2(**SIZES["qwen2_72b"])


def qwen2_5_0_5b() -> TransformerDecoder:
    return qwen2(**SIZES["qwen2_5_0_5b"])


def qwen2_5_1_5b() -> TransformerDecoder:
    return qwen2(**SIZES["qwen2_5_1_5b"])


def qwen2_5_3b() -> TransformerDecoder:
    return qwen2(**SIZES["qwen2_5_3b"])


def qwen2_5_7b() -> TransformerDecoder:
    return qwen2(**SIZES["qwen2_5_7b"])


def qwen2_5_14b() -> TransformerDecoder:
    return qwen2(**SIZES["qwen2_5_14b"])


def qwen2_5_32b() -> TransformerDecoder:
    return qwen2(**SIZES["qwen2_5_32b"])


def qwen2_5_72b() -> TransformerDecoder:
    return qwen2(**SIZES["qwen2_5_72b"])


def qwen2_tiny() -> TransformerDecoder:
    return qwen2(**SIZES["qwen2_tiny"])


lora_qwen2_0_5b = lora_preset(lora_qwen2, "lora_qwen2_0_5b", __name__, **SIZES["qwen2_0_5b"])
lora_qwen2_1_5b = lora_preset(lora_qwen2, "lora_qwen2_1_5b", __name__, **SIZES["qwen2_1_5b"])
lora_qwen2_7b = lora_preset(lora_qwen2, "lora_qwen2_7b", __name__, **SIZES["qwen2_7b"])
lora_qwen2_72b = lora_preset(lora_qwen2, "lora_qwen2_72b", __name__, **SIZES["qwen2_72b"])
lora_qwen2_5_0_5b = lora_preset(lora_qwen2, "lora_qwen2_5_0_5b", __name__, **SIZES["qwen2_5_0_5b"])
lora_qwen2_5_1_5b = lora_preset(lora_qwen2, "lora_qwen2_5_1_5b", __name__, **SIZES["qwen2_5_1_5b"])
lora_qwen2_5_3b = lora_preset(lora_qwen2, "lora_qwen2_5_3b", __name__, **SIZES["qwen2_5_3b"])
lora_qwen2_5_7b = lora_preset(lora_qwen2, "lora_qwen2_5_7b", __name__, **SIZES["qwen2_5_7b"])
lora_qwen2_5_14b = lora_preset(lora_qwen2, "lora_qwen2_5_14b", __name__, **SIZES["qwen2_5_14b"])
lora_qwen2_5_32b = lora_preset(lora_qwen2, "lora_qwen2_5_32b", __name__, **SIZES["qwen2_5_32b"])
lora_qwen2_5_72b = lora_preset(lora_qwen2, "lora_qwen2_5_72b", __name__, **SIZES["qwen2_5_72b"])
lora_qwen2_tiny = lora_preset(lora_qwen2, "lora_qwen2_tiny", __name__, **SIZES["qwen2_tiny"])
qlora_qwen2_0_5b = lora_preset(
    lora_qwen2, "qlora_qwen2_0_5b", __name__, **SIZES["qwen2_0_5b"], quantize_base=True
)
qlora_qwen2_1_5b = lora_preset(
    lora_qwen2, "qlora_qwen2_1_5b", __name__, **SIZES["qwen2_1_5b"], quantize_base=True
)
qlora_qwen2_7b = lora_preset(lora_qwen2, "qlora_qwen2_7b", __name__, **SIZES["qwen2_7b"], quantize_base=True)
qlora_qwen2_72b = lora_preset(
    lora_qwen2, "qlora_qwen2_72b", __name__, **SIZES["qwen2_72b"], quantize_base=True
)
qlora_qwen2_5_0_5b = lora_preset(
    lora_qwen2, "qlora_qwen2_5_0_5b", __name__, **SIZES["qwen2_5_0_5b"], quantize_base=True
)
qlora_qwen2_5_1_5b = lora_preset(
    lora_qwen2, "qlora_qwen2_5_1_5b", __name__, **SIZES["qwen2_5_1_5b"], quantize_base=True
)
qlora_qwen2_5_3b = lora_preset(
    lora_qwen2, "qlora_qwen2_5_3b", __name__, **SIZES["qwen2_5_3b"], quantize_base=True
)
qlora_qwen2_5_7b = lora_preset(
    lora_qwen2, "qlora_qwen2_5_7b", __name__, **SIZES["qwen2_5_7b"], quantize_base=True
)
qlora_qwen2_5_14b = lora_preset(
    lora_qwen2, "qlora_qwen2_5_14b", __name__, **SIZES["qwen2_5_14b"], quantize_base=True
)
qlora_qwen2_5_32b = lora_preset(
    lora_qwen2, "qlora_qwen2_5_32b", __name__, **SIZES["qwen2_5_32b"], quantize_base=True
)
qlora_qwen2_5_72b = lora_preset(
    lora_qwen2, "qlora_qwen2_5_72b", __name__, **SIZES["qwen2_5_72b"], quantize_base=True
)
