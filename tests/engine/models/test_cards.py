"""Model cards: counts computed from the builders equal the published parameter counts, and
every preset's derived config builds the same-sized model in transformers."""

from __future__ import annotations

import pytest
import torch

from engine.models import model_card, model_cards
from engine.models.cards import PRESETS
from engine.models.hf_config import hf_config_from_model

# Parameter totals as reported by the checkpoints' safetensors indexes / model pages.
PUBLISHED = {
    "llama2_7b": 6_738_415_616,
    "llama3_1_8b": 8_030_261_248,
    "llama3_2_1b": 1_235_814_400,
    "llama3_2_3b": 3_212_749_824,
    "qwen2_5_0_5b": 494_032_768,
    "qwen2_5_7b": 7_615_616_512,
    "qwen3_8b": 8_190_735_360,
    "mistral_7b": 7_241_732_096,
    "smollm2_135m": 134_515_008,
    "smollm2_360m": 361_821_120,
    "qwen3_moe_30b_a3b": 30_532_122_624,
    "mixtral_8x7b": 46_702_792_704,
    "mixtral_8x22b": 140_630_071_296,
}
# Parameters per token as the model pages round them (Qwen3 "3.3B/22B activated", Mixtral "12.9B/39B").
PUBLISHED_ACTIVE_B = {
    "qwen3_moe_30b_a3b": 3.3,
    "qwen3_moe_235b_a22b": 22.2,
    "mixtral_8x7b": 12.9,
    "mixtral_8x22b": 39.2,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_counts(name):
    assert model_card(name).params == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE_B))
def test_moe_active_parameters(name):
    card = model_card(name)
    assert abs(card.active_params / 1e9 - PUBLISHED_ACTIVE_B[name]) < 0.06
    assert card.num_experts in (8, 128) and card.experts_per_token in (2, 8)


def test_dense_cards_have_all_parameters_active():
    card = model_card("qwen3_8b")
    assert (card.active_params, card.num_experts) == (card.params, 0)


@pytest.mark.parametrize("name", ["qwen3_moe_30b_a3b", "mixtral_8x7b", "qwen3_moe_tiny", "mixtral_tiny"])
def test_transformers_builds_the_same_moe_size(name):
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        ours = PRESETS[name].builder()
        config = transformers.AutoConfig.for_model(**hf_config_from_model(ours))
        theirs = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in theirs.parameters()) == model_card(name).params


@pytest.mark.parametrize(
    "name",
    ["smollm2_135m", "qwen3_0_6b", "qwen2_5_1_5b", "llama3_2_1b", "mistral_7b", "phi3_mini_4k", "phi4_14b"],
)
def test_transformers_builds_the_same_size(name):
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        ours = PRESETS[name].builder()
        config = transformers.AutoConfig.for_model(**hf_config_from_model(ours))
        theirs = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in theirs.parameters()) == model_card(name).params


def test_cards_fields():
    cards = {c.name: c for c in model_cards()}
    assert "llama3_tiny" not in cards and "llama3_tiny" in {c.name for c in model_cards(include_tiny=True)}
    q = cards["qwen3_0_6b"]
    assert (q.family, q.layers, q.embed_dim, q.num_heads, q.num_kv_heads, q.head_dim) == (
        "Qwen3",
        28,
        1024,
        16,
        8,
        128,
    )
    assert (q.vocab_size, q.context_length, q.tied_embeddings, q.licence) == (
        151_936,
        40_960,
        True,
        "Apache-2.0",
    )
    assert q.hub_id == "Qwen/Qwen3-0.6B" and q.builder == "engine.models.qwen3.qwen3_0_6b"
    assert cards["llama3_2_1b"].licence == "Llama 3.2 Community License"
    with pytest.raises(KeyError, match="unknown model preset"):
        model_card("gpt5")
