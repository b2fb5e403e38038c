"""The memory estimate counts what DPO and KD hold besides the policy: DPO's chosen and rejected rows
and (full fine-tune) its frozen reference copy; KD's frozen teacher, sized from its own model card."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from workbench.services import estimate_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LLAMA_3_1_8B_PARAMS = 8_030_261_248  # Meta's published parameter count of Llama 3.1 8B


def _load(name: str) -> dict:
    return yaml.safe_load((CONFIGS / name).read_text())


def test_kd_adds_the_teacher_weights_at_the_compute_width():
    cfg = _load("llama3_2/1B_kd.yaml")  # teacher: engine.models.llama3.llama3_1_8b, bf16
    student_only = estimate_config(cfg, 1, recipe="sft")
    with_teacher = estimate_config(cfg, 1, recipe="kd")
    assert with_teacher.weights_bytes - student_only.weights_bytes == pytest.approx(2 * LLAMA_3_1_8B_PARAMS)
    assert with_teacher.activations_bytes == student_only.activations_bytes  # the teacher saves none
    assert any(n.startswith("teacher model: 14.96 GiB") for n in with_teacher.notes)
    sharded = estimate_config(cfg, 2, recipe="kd")  # KD is one process: nproc is ignored
    assert sharded.weights_bytes == with_teacher.weights_bytes


def test_full_dpo_holds_a_reference_copy_and_two_rows_per_pair():
    cfg = _load("llama3_2/1B_full.yaml")
    sft = estimate_config(cfg, 1, recipe="sft")
    dpo = estimate_config(cfg, 1, recipe="dpo")
    assert dpo.weights_bytes == pytest.approx(2 * sft.weights_bytes)  # policy + frozen reference, same width
    assert dpo.gradients_bytes == sft.gradients_bytes and dpo.optimizer_bytes == sft.optimizer_bytes
    # Every activation term is per token, and a pair is two rows: compare at the same logits handling.
    no_lce = copy.deepcopy(cfg)
    no_lce["loss"] = {"_component_": "engine.modules.loss.ChunkedCrossEntropyLoss"}
    assert dpo.activations_bytes == pytest.approx(
        2 * estimate_config(no_lce, 1, recipe="sft").activations_bytes
    )
    two_ranks = estimate_config(cfg, 2, recipe="dpo")
    assert two_ranks.weights_bytes == pytest.approx(dpo.weights_bytes / 2)  # FSDP shards the reference too


def test_lora_dpo_uses_the_adapter_free_base_as_reference():
    cfg = _load("llama3_2/1B_lora_dpo.yaml")
    sft = estimate_config(cfg, 1, recipe="sft")
    dpo = estimate_config(cfg, 1, recipe="dpo")
    assert dpo.weights_bytes == sft.weights_bytes
    assert not any(n.startswith("reference model") for n in dpo.notes)


def test_grpo_trains_on_completions_and_caches_the_rollouts_keys_and_values():
    from engine.training.memory_estimate import GiB

    cfg = _load("qwen2_5/0.5B_lora_grpo.yaml")  # batch 8 x group 8, prompts <= 384, 384 new, minibatch 16
    rows, length = 8 * 8, 384 + 384
    # Qwen2.5-0.5B: 24 layers, 2 KV heads x 64 dims; keys and values; bf16
    kv_bytes = rows * length * 24 * 2 * (2 * 64) * 2
    sync = estimate_config(cfg, 1, recipe="grpo")
    assert any(n.startswith(f"rollouts: KV cache {kv_bytes / GiB:.2f} GiB") for n in sync.notes), sync.notes
    trained = estimate_config(cfg, 1, recipe="grpo_async")  # async: rollouts live in the generators
    # its training pass is an SFT-shaped batch of 16 completions x 768 tokens with plain cross-entropy
    as_sft = copy.deepcopy(cfg)
    as_sft.update(batch_size=16, max_seq_len=length)
    as_sft["loss"] = {"_component_": "engine.modules.loss.ChunkedCrossEntropyLoss"}
    assert trained.activations_bytes == estimate_config(as_sft, 1, recipe="sft").activations_bytes
    assert sync.activations_bytes == max(trained.activations_bytes, kv_bytes)
    assert not any(n.startswith("rollouts") for n in trained.notes)


def test_full_grpo_with_a_kl_term_holds_a_reference_copy():
    cfg = _load("qwen2_5/0.5B_lora_grpo.yaml")
    cfg["model"] = {"_component_": "engine.models.qwen2.qwen2_5_0_5b"}
    with_kl = estimate_config(cfg, 1, recipe="grpo")
    cfg["loss"] = {"_component_": "engine.modules.loss.GRPOLoss", "kl_coeff": 0.0}
    without_kl = estimate_config(cfg, 1, recipe="grpo")
    assert with_kl.weights_bytes == pytest.approx(2 * without_kl.weights_bytes)


def test_ppo_holds_reward_and_value_models_and_lora_needs_no_reference():
    from engine.models import model_card
    from engine.training.memory_estimate import ModelShape

    cfg = _load("qwen2_5/0.5B_lora_ppo.yaml")  # LoRA policy, frozen full reward model, LoRA value model
    params = ModelShape.from_card(model_card("qwen2_5_0_5b")).num_params  # the estimate's own count
    grpo_like = estimate_config({**cfg, "value_model": None, "reward_model": None}, 1, recipe="ppo")
    ppo = estimate_config(cfg, 1, recipe="ppo")
    # + the reward model's and the value model's bf16 weights (a LoRA value model: base counted as weights)
    assert ppo.weights_bytes - grpo_like.weights_bytes == pytest.approx(2 * 2 * params)
    assert not any(n.startswith("reference model") for n in ppo.notes)
    full = copy.deepcopy(cfg)
    full["model"]["_component_"] = "engine.models.qwen2.qwen2_5_0_5b"
    for key in ("lora_attn_modules", "apply_lora_to_mlp", "lora_rank", "lora_alpha", "lora_dropout"):
        full["model"].pop(key)
    full["value_model"]["decoder"] = {"_component_": "engine.models.qwen2.qwen2_5_0_5b"}
    full_ppo = estimate_config(full, 1, recipe="ppo")
    full_sft = estimate_config({**full, "value_model": None, "reward_model": None}, 1, recipe="ppo")
    # (the reference copy is in both) + reward weights (2 bytes) + the full value model's weights,
    # gradients (2 + 2) and AdamW's two states at the parameter width (2 + 2)
    assert full_ppo.weights_bytes - full_sft.weights_bytes == pytest.approx((2 + 2 + 2 + 4) * params)
    assert any(n.startswith("reference model") for n in full_ppo.notes)


def test_reward_model_is_sized_like_sft_on_its_decoder_with_two_rows_per_pair():
    cfg = _load("qwen2_5/0.5B_lora_reward_model.yaml")
    rm = estimate_config(cfg, 1, recipe="reward_model")
    sft = estimate_config({**cfg, "model": cfg["model"]["decoder"]}, 1, recipe="sft")
    assert rm.weights_bytes == pytest.approx(sft.weights_bytes)
    assert rm.activations_bytes > sft.activations_bytes
