"""Model cards for browsing: one per size preset, parameter counts computed on the meta device."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from engine.models import llama2, llama3, mistral, mixtral, phi3, qwen2, qwen3, qwen3_moe, smollm2
from engine.modules.moe import moe_layers

_LLAMA2 = "Llama 2 Community License"
_APACHE = "Apache-2.0"


@dataclass(frozen=True)
class _Entry:
    builder: Callable[[], nn.Module]
    family: str
    licence: str
    hub_id: str | None


# Preset name -> how to build it and where it comes from. Sizes live in the family modules.
PRESETS: dict[str, _Entry] = {
    "llama2_7b": _Entry(llama2.llama2_7b, "Llama 2", _LLAMA2, "meta-llama/Llama-2-7b-hf"),
    "llama2_13b": _Entry(llama2.llama2_13b, "Llama 2", _LLAMA2, "meta-llama/Llama-2-13b-hf"),
    "llama2_70b": _Entry(llama2.llama2_70b, "Llama 2", _LLAMA2, "meta-llama/Llama-2-70b-hf"),
    "llama3_8b": _Entry(llama3.llama3_8b, "Llama 3", "Llama 3 Community License", "meta-llama/Meta-Llama-3-8B"),
    "llama3_1_8b": _Entry(llama3.llama3_1_8b, "Llama 3.1", "Llama 3.1 Community License", "meta-llama/Llama-3.1-8B"),
    "llama3_1_70b": _Entry(
        llama3.llama3_1_70b, "Llama 3.1", "Llama 3.1 Community License", "meta-llama/Llama-3.1-70B"
    ),
    "llama3_2_1b": _Entry(llama3.llama3_2_1b, "Llama 3.2", "Llama 3.2 Community License", "meta-llama/Llama-3.2-1B"),
    "llama3_2_3b": _Entry(llama3.llama3_2_3b, "Llama 3.2", "Llama 3.2 Community License", "meta-llama/Llama-3.2-3B"),
    "llama3_3_70b": _Entry(
        llama3.llama3_3_70b, "Llama 3.3", "Llama 3.3 Community License", "meta-llama/Llama-3.3-70B-Instruct"
    ),
    "qwen2_0_5b": _Entry(qwen2.qwen2_0_5b, "Qwen2", _APACHE, "Qwen/Qwen2-0.5B"),
    "qwen2_1_5b": _Entry(qwen2.qwen2_1_5b, "Qwen2", _APACHE, "Qwen/Qwen2-1.5B"),
    "qwen2_7b": _Entry(qwen2.qwen2_7b, "Qwen2", _APACHE, "Qwen/Qwen2-7B"),
    "qwen2_72b": _Entry(qwen2.qwen2_72b, "Qwen2", "Tongyi Qianwen License", "Qwen/Qwen2-72B"),
    "qwen2_5_0_5b": _Entry(qwen2.qwen2_5_0_5b, "Qwen2.5", _APACHE, "Qwen/Qwen2.5-0.5B"),
    "qwen2_5_1_5b": _Entry(qwen2.qwen2_5_1_5b, "Qwen2.5", _APACHE, "Qwen/Qwen2.5-1.5B"),
    "qwen2_5_3b": _Entry(qwen2.qwen2_5_3b, "Qwen2.5", "Qwen Research License", "Qwen/Qwen2.5-3B"),
    "qwen2_5_7b": _Entry(qwen2.qwen2_5_7b, "Qwen2.5", _APACHE, "Qwen/Qwen2.5-7B"),
    "qwen2_5_14b": _Entry(qwen2.qwen2_5_14b, "Qwen2.5", _APACHE, "Qwen/Qwen2.5-14B"),
    "qwen2_5_32b": _Entry(qwen2.qwen2_5_32b, "Qwen2.5", _APACHE, "Qwen/Qwen2.5-32B"),
    "qwen2_5_72b": _Entry(qwen2.qwen2_5_72b, "Qwen2.5", "Qwen License", "Qwen/Qwen2.5-72B"),
    "qwen3_0_6b": _Entry(qwen3.qwen3_0_6b, "Qwen3", _APACHE, "Qwen/Qwen3-0.6B"),
    "qwen3_1_7b": _Entry(qwen3.qwen3_1_7b, "Qwen3", _APACHE, "Qwen/Qwen3-1.7B"),
    "qwen3_4b": _Entry(qwen3.qwen3_4b, "Qwen3", _APACHE, "Qwen/Qwen3-4B"),
    "qwen3_8b": _Entry(qwen3.qwen3_8b, "Qwen3", _APACHE, "Qwen/Qwen3-8B"),
    "qwen3_14b": _Entry(qwen3.qwen3_14b, "Qwen3", _APACHE, "Qwen/Qwen3-14B"),
    "qwen3_32b": _Entry(qwen3.qwen3_32b, "Qwen3", _APACHE, "Qwen/Qwen3-32B"),
    "mistral_7b": _Entry(mistral.mistral_7b, "Mistral", _APACHE, "mistralai/Mistral-7B-v0.1"),
    "mistral_7b_v0_3": _Entry(mistral.mistral_7b_v0_3, "Mistral", _APACHE, "mistralai/Mistral-7B-v0.3"),
    "qwen3_moe_30b_a3b": _Entry(qwen3_moe.qwen3_moe_30b_a3b, "Qwen3-MoE", _APACHE, "Qwen/Qwen3-30B-A3B"),
    "qwen3_moe_235b_a22b": _Entry(qwen3_moe.qwen3_moe_235b_a22b, "Qwen3-MoE", _APACHE, "Qwen/Qwen3-235B-A22B"),
    "mixtral_8x7b": _Entry(mixtral.mixtral_8x7b, "Mixtral", _APACHE, "mistralai/Mixtral-8x7B-v0.1"),
    "mixtral_8x22b": _Entry(mixtral.mixtral_8x22b, "Mixtral", _APACHE, "mistralai/Mixtral-8x22B-v0.1"),
    "smollm2_135m": _Entry(smollm2.smollm2_135m, "SmolLM2", _APACHE, "HuggingFaceTB/SmolLM2-135M"),
    "smollm2_360m": _Entry(smollm2.smollm2_360m, "SmolLM2", _APACHE, "HuggingFaceTB/SmolLM2-360M"),
    "smollm2_1_7b": _Entry(smollm2.smollm2_1_7b, "SmolLM2", _APACHE, "HuggingFaceTB/SmolLM2-1.7B"),
    "phi3_mini_4k": _Entry(phi3.phi3_mini_4k, "Phi-3", "MIT", "microsoft/Phi-3-mini-4k-instruct"),
    "phi3_medium_4k": _Entry(phi3.phi3_medium_4k, "Phi-3", "MIT", "microsoft/Phi-3-medium-4k-instruct"),
    "phi4_14b": _Entry(phi3.phi4_14b, "Phi-4", "MIT", "microsoft/phi-4"),
    # Tiny presets for tests (random weights only).
    "llama2_tiny": _Entry(llama2.llama2_tiny, "Llama 2", _APACHE, None),
    "llama3_tiny": _Entry(llama3.llama3_tiny, "Llama 3", _APACHE, None),
    "qwen2_tiny": _Entry(qwen2.qwen2_tiny, "Qwen2", _APACHE, None),
    "qwen3_tiny": _Entry(qwen3.qwen3_tiny, "Qwen3", _APACHE, None),
    "mistral_tiny": _Entry(mistral.mistral_tiny, "Mistral", _APACHE, None),
    "qwen3_moe_tiny": _Entry(qwen3_moe.qwen3_moe_tiny, "Qwen3-MoE", _APACHE, None),
    "mixtral_tiny": _Entry(mixtral.mixtral_tiny, "Mixtral", _APACHE, None),
    "phi3_tiny": _Entry(phi3.phi3_tiny, "Phi-3", "MIT", None),
}  # fmt: skip


@dataclass(frozen=True)
class ModelCard:
    """What the model browser shows for one preset. `params` counts tied weights once; for a mixture
    of experts `intermediate_dim` is one expert's hidden size and `active_params` counts the weights
    one token runs through (`experts_per_token` of `num_experts` per layer; equal to `params` if dense)."""

    name: str
    family: str
    params: int
    layers: int
    embed_dim: int
    intermediate_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    tied_embeddings: bool
    licence: str
    hub_id: str | None
    builder: str  # `_component_` path of the zero-argument preset
    active_params: int = 0
    num_experts: int = 0
    experts_per_token: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@functools.cache
def model_card(name: str) -> ModelCard:
    """The card of preset `name`. Raises KeyError listing the known presets."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}")
    entry = PRESETS[name]
    with torch.device("meta"):
        model = entry.builder()
    attn = model.layers[0].attn
    vocab, dim = model.tok_embeddings.weight.shape
    params = sum(p.numel() for p in model.parameters())  # parameters() yields shared ones once
    moe = moe_layers(model)
    if moe:
        per_expert = sum(p[0].numel() for p in moe[0].experts.parameters())
        idle = sum((m.num_experts - m.top_k) * per_expert for m in moe)
        hidden = moe[0].settings.moe_intermediate_dim
    else:
        idle, hidden = 0, model.layers[0].mlp.hidden_dim
    return ModelCard(
        name=name,
        family=entry.family,
        params=params,
        layers=len(model.layers),
        embed_dim=int(dim),
        intermediate_dim=hidden,
        num_heads=attn.num_heads,
        num_kv_heads=attn.num_kv_heads,
        head_dim=attn.head_dim,
        vocab_size=int(vocab),
        context_length=model.max_seq_len,
        tied_embeddings=model.tied,
        licence=entry.licence,
        hub_id=entry.hub_id,
        builder=f"{entry.builder.__module__}.{entry.builder.__name__}",
        active_params=params - idle,
        num_experts=moe[0].num_experts if moe else 0,
        experts_per_token=moe[0].top_k if moe else 0,
    )


def model_cards(include_tiny: bool = False) -> list[ModelCard]:
    """Cards of every preset (tiny test presets only when `include_tiny`)."""
    return [model_card(n) for n in PRESETS if include_tiny or not n.endswith("_tiny")]
