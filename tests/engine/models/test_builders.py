"""Builders as configs use them: every preset resolves through the `_component_` allow-list,
validation sees the forwarded size/LoRA keys, and LoRA presets place adapters where asked."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from engine.config import ConfigError, instantiate, validate
from engine.modules.peft import LoRALinear

FAMILIES = ["llama2", "llama3", "qwen2", "qwen3", "mistral", "smollm2", "qwen3_moe", "mixtral", "phi3"]


def _presets():
    for family in FAMILIES:
        module = importlib.import_module(f"engine.models.{family}")
        for name in module.SIZES:
            for prefix in ("", "lora_", "qlora_"):
                if hasattr(module, prefix + name):
                    yield f"engine.models.{family}.{prefix}{name}"


def test_every_preset_is_an_allowed_component_and_builds_on_meta():
    paths = list(_presets())
    assert len(paths) > 100
    for path in paths:
        assert validate({"model": {"_component_": path}}) == [], path
    with torch.device("meta"):
        model = instantiate({"_component_": "engine.models.qwen3.qlora_qwen3_0_6b", "lora_rank": 4})
    assert model.layers[0].attn.q_proj.quantize_base and model.layers[0].attn.q_proj.rank == 4


def test_validate_names_a_mistyped_forwarded_key():
    problems = validate({"model": {"_component_": "engine.models.llama3.lora_llama3_tiny", "num_layer": 2}})
    assert len(problems) == 1 and "num_layer" in str(problems[0]) and "num_layers" in str(problems[0])


def test_lora_placement():
    model = instantiate(
        {
            "_component_": "engine.models.qwen2.lora_qwen2_tiny",
            "lora_attn_modules": ["k_proj", "output_proj"],
            "apply_lora_to_mlp": True,
            "lora_rank": 2,
        }
    )
    attn, mlp = model.layers[1].attn, model.layers[1].mlp
    assert isinstance(attn.k_proj, LoRALinear) and isinstance(attn.output_proj, LoRALinear)
    assert not isinstance(attn.q_proj, LoRALinear) and not isinstance(attn.v_proj, LoRALinear)
    assert attn.k_proj.bias is not None and not attn.k_proj.bias.requires_grad  # Qwen2 QKV bias kept frozen
    assert all(isinstance(m, LoRALinear) for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    with pytest.raises(ConfigError, match="apply_lora_to_output needs an untied output projection"):
        instantiate({"_component_": "engine.models.qwen2.lora_qwen2_tiny", "apply_lora_to_output": True})


def test_family_builders_take_only_their_family_knobs():
    """Each family's builder signature is made from its `Family`: the knobs it has, the defaults it
    declares, nothing it fixes; its functions live in the family module."""
    from engine.models import llama2, llama3, mistral, mixtral, qwen2, qwen3_moe
    from engine.models._decoder_builder import Family

    def params(fn):
        return inspect.signature(fn).parameters

    assert params(llama2.llama2)["rope_scaling"].default is None and "sliding_window" not in params(
        llama2.llama2
    )
    assert params(llama3.llama3)["rope_base"].default == 500_000.0 and "rope_scaling" in params(llama3.llama3)
    assert params(mistral.mistral)["sliding_window"].default is None
    assert "attn_bias" not in params(qwen2.qwen2) and params(qwen2.qwen2)["norm_eps"].default == 1e-6
    moe = params(qwen3_moe.qwen3_moe)
    assert "intermediate_dim" not in moe and moe["moe_intermediate_dim"].default is inspect.Parameter.empty
    assert moe["num_experts"].default == 128 and "norm_topk_prob" not in params(mixtral.mixtral)
    assert "apply_lora_to_experts" in params(mixtral.lora_mixtral) and "apply_lora_to_mlp" not in params(
        mixtral.lora_mixtral
    )
    assert params(llama3.lora_llama3_2_1b)["embed_dim"].default == 2048
    assert not params(llama3.llama3_2_1b) and llama3.llama3_2_1b.__module__ == "engine.models.llama3"
    with pytest.raises(TypeError, match=r"llama2\(\): got an unexpected keyword argument 'sliding_window'"):
        llama2.llama2(**llama2.SIZES["llama2_tiny"], sliding_window=None)
    with pytest.raises(TypeError, match="qwen3_moe.*apply_lora_to_mlp"):
        qwen3_moe.lora_qwen3_moe_tiny(apply_lora_to_mlp=True)
    model = qwen2.qwen2_tiny()
    assert model.layers[0].attn.q_proj.bias is not None  # the fixed QKV bias
    with pytest.raises(ValueError, match="attn_bias"):
        Family("x", __name__, "doc", defaults={"attn_bias": True}, sizes={})
