"""Llama 2: multi-head (7B/13B) and grouped-query (70B) attention, RoPE theta 10k, vocab 32k.

Launch-time use: `_component_: engine.models.llama2.llama2_7b` (or `lora_llama2_7b`, `qlora_llama2_7b`).
"""

from __future__ import annotations

from engine.models._decoder_builder import LoRASettings, build_decoder, forward_signature, lora_preset
from engine.modules.transformer import TransformerDecoder


def llama2(
    *,
    vocab_size: int = 32_000,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int = 4096,
    head_dim: int | None = None,
    norm_eps: float = 1e-5,
    rope_base: float = 10_000.0,
    tie_word_embeddings: bool = False,
    attn_dropout: float = 0.0,
    lora: LoRASettings | None = None,
) -> TransformerDecoder:
    """A Llama-2 decoder from its sizes (untied output, no biases)."""
    return build_decoder(**locals())


def lora_llama2(
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
    """`llama2(**model_kwargs)` with LoRA/DoRA adapters (QLoRA when `quantize_base`)."""
    lora = LoRASettings(
        tuple(lora_attn_modules), apply_lora_to_mlp, apply_lora_to_output, lora_rank, lora_alpha,
        lora_dropout, quantize_base, use_dora,
    )  # fmt: skip
    return llama2(**model_kwargs, lora=lora)


lora_llama2.__signature__ = forward_signature(lora_llama2, llama2)


SIZES = {
    "llama2_7b": dict(num_layers=32, num_heads=32, num_kv_heads=32, embed_dim=4096, intermediate_dim=11008),
    "llama2_13b": dict(num_layers=40, num_heads=40, num_kv_heads=40, embed_dim=5120, intermediate_dim=13824),
    "llama2_70b": dict(num_layers=80, num_heads=64, num_kv_heads=8, embed_dim=8192, intermediate_dim=28672),
    "llama2_tiny": dict(vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=4, embed_dim=64, intermediate_dim=128, max_seq_len=256),
}  # fmt: skip


def llama2_7b() -> TransformerDecoder:
    return llama2(**SIZES["llama2_7b"])


def llama2_13b() -> TransformerDecoder:
    return llama2(**SIZES["llama2_13b"])


def llama2_70b() -> TransformerDecoder:
    return llama2(**SIZES["llama2_70b"])


def llama2_tiny() -> TransformerDecoder:
    return llama2(**SIZES["llama2_tiny"])


lora_llama2_7b = lora_preset(lora_llama2, "lora_llama2_7b", __name__, **SIZES["llama2_7b"])
lora_llama2_13b = lora_preset(lora_llama2, "lora_llama2_13b", __name__, **SIZES["llama2_13b"])
lora_llama2_70b = lora_preset(lora_llama2, "lora_llama2_70b", __name__, **SIZES["llama2_70b"])
lora_llama2_tiny = lora_preset(lora_llama2, "lora_llama2_tiny", __name__, **SIZES["llama2_tiny"])
qlora_llama2_7b = lora_preset(
    lora_llama2, "qlora_llama2_7b", __name__, **SIZES["llama2_7b"], quantize_base=True
)
qlora_llama2_13b = lora_preset(
    lora_llama2, "qlora_llama2_13b", __name__, **SIZES["llama2_13b"], quantize_base=True
)
qlora_llama2_70b = lora_preset(
    lora_llama2, "qlora_llama2_70b", __name__, **SIZES["llama2_70b"], quantize_base=True
)
