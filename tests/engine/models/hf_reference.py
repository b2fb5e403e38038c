"""Tiny random Hugging Face reference models (transformers' own classes) for parity tests."""

from __future__ import annotations

from pathlib import Path

import torch

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def hf_config(family: str, **overrides):
    import transformers

    sizes = {**TINY, **overrides}
    if family == "llama2":
        return transformers.LlamaConfig(**{**sizes, "num_key_value_heads": 4}, rms_norm_eps=1e-5)
    if family == "llama3":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        }
        return transformers.LlamaConfig(**{"rope_parameters": rope, **sizes}, tie_word_embeddings=True)
    if family == "qwen2":
        return transformers.Qwen2Config(**sizes, tie_word_embeddings=False)
    if family == "qwen3":
        return transformers.Qwen3Config(**sizes, head_dim=24, tie_word_embeddings=True)
    if family == "mistral":
        return transformers.MistralConfig(**{"sliding_window": 6, **sizes})
    if family == "qwen3_moe":
        moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
        return transformers.Qwen3MoeConfig(
            **{**sizes, **moe, **overrides}, head_dim=16, tie_word_embeddings=False
        )
    if family == "mixtral":
        moe = dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48)
        return transformers.MixtralConfig(**{**sizes, **moe, **overrides})
    if family == "phi3":  # Phi-3-mini-4k's layout: MHA-sized q, a sliding window shorter than the tests' rows
        return transformers.Phi3Config(
            **{"sliding_window": 6, **sizes}, pad_token_id=None, bos_token_id=1, eos_token_id=2
        )
    if family == "phi4":  # Phi-4's shape, scaled down: GQA (40/10 -> 4/1), theta 250k, no window
        return transformers.Phi3Config(**{**sizes, "num_key_value_heads": 1, "rope_parameters": {"rope_type": "default",
                                       "rope_theta": 250000.0}, **overrides}, pad_token_id=None, bos_token_id=1,
                                       eos_token_id=2)  # fmt: skip
    raise ValueError(family)


def hf_model(family: str, seed: int = 0, **overrides):
    """A transformers causal LM with every parameter (norms, biases included) randomised."""
    import transformers

    torch.manual_seed(seed)
    config = hf_config(family, **overrides)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def save_hf(model, out: Path, **kwargs) -> Path:
    model.save_pretrained(out, **kwargs)
    return out
