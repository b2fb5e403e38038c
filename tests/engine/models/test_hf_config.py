"""config.json parsing: the published (transformers 4 style) configs of real checkpoints build the
same model as our presets; unsupported settings are one clear line."""

from __future__ import annotations

import pytest
import torch

from engine.checkpoint import CheckpointError
from engine.models import build_decoder, model_card
from engine.models.hf_config import decoder_kwargs
from engine.modules.rotary import Llama3RopeScaling

# As published on the Hub (abridged to the fields that matter), transformers-4 spelling.
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 128256,
    "attention_bias": False, "mlp_bias": False,
}  # fmt: skip
QWEN2_5_0_5B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "hidden_size": 896,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "preset"), [(LLAMA_3_2_1B, "llama3_2_1b"), (QWEN2_5_0_5B, "qwen2_5_0_5b")]
)
def test_published_configs_build_the_preset(config, preset):
    kwargs = decoder_kwargs(config)
    with torch.device("meta"):
        model = build_decoder(**kwargs)
    assert sum(p.numel() for p in model.parameters()) == model_card(preset).params
    assert model.tied and model.sliding_window is None


def test_llama3_rope_scaling_is_read_from_either_spelling():
    legacy = decoder_kwargs(LLAMA_3_2_1B)
    v5 = dict(LLAMA_3_2_1B)
    v5.pop("rope_theta")
    v5["rope_parameters"] = {**v5.pop("rope_scaling"), "rope_theta": 500000.0}
    assert decoder_kwargs(v5) == legacy
    assert legacy["rope_scaling"] == Llama3RopeScaling(32.0, 1.0, 4.0, 8192)
    assert legacy["rope_base"] == 500000.0


def test_qwen3_yarn_long_context_block_loads():
    """The block Qwen3's model card tells users to add for 131k tokens (transformers 4 spelling)."""
    from engine.modules.rope_scaling import YarnRopeScaling

    qwen3 = {
        **LLAMA_3_2_1B,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "max_position_embeddings": 131072,
    }
    qwen3["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    kwargs = decoder_kwargs(qwen3)
    assert kwargs["rope_scaling"] == YarnRopeScaling(factor=4.0, original_max_position_embeddings=32768)
    assert kwargs["max_seq_len"] == 131072 and kwargs["qk_norm"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"rope_scaling": {"rope_type": "proportional", "factor": 4.0}},
            "rope_type 'proportional' is not supported",
        ),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"num_hidden_layers": None}, "a size field is not a number"),
        ({"architectures": ["FalconForCausalLM"], "model_type": "falcon"}, "architecture FalconForCausalLM"),
    ],
)
def test_unsupported_configs_are_one_line(change, message):
    with pytest.raises(CheckpointError, match=message) as exc:
        decoder_kwargs({**LLAMA_3_2_1B, **change})
    assert "\n" not in str(exc.value)


def test_missing_field_is_named():
    config = dict(LLAMA_3_2_1B)
    del config["hidden_size"]
    with pytest.raises(CheckpointError, match="field hidden_size is missing"):
        decoder_kwargs(config)
