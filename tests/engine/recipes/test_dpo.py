"""DPO recipe on the demo preference pairs (right answer vs a wrong final result), tiny Llama, CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.engine.recipes._recipe_runner import train_in_process

TINY = {
    "_component_": "engine.models.llama3.llama3",
    "vocab_size": 49152,  # the SmolLM2 tokenizer's
    "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64, "intermediate_dim": 128,
    "max_seq_len": 256, "rope_base": 10000.0,
}  # fmt: skip


# The demo pairs laid out as plain text whatever the tokenizer folder holds: the shared assets'
# SmolLM2 is a bare tokenizer.json, a bare clone's stand-in (rebuilt from the demo GGUF, see conftest.py
# `repo_assets`) carries SmolLM2's chat template and EOS, whose system prompt pushed the answers past
# max_seq_len 80, so half the pairs were cut to chosen == rejected. 128 holds every pair in full (the
# longest is 92 tokens), where chosen and rejected differ: in their final results.
DEMO_PAIRS = {"_component_": "engine.data.demo_preference_dataset", "max_seq_len": 128, "chat_format": None,
              "cache": False}  # fmt: skip


def dpo_config(assets, out, **over):
    cfg = {
        "output_dir": str(out), "seed": 0, "device": "cpu", "dtype": "fp32", "checkpoint_dir": None,
        "model": copy.deepcopy(TINY),
        "tokenizer": {"_component_": "engine.data.tokenizers.load_tokenizer", "path": str(assets / "tokenizers" / "smollm2")},
        "dataset": DEMO_PAIRS | {"n": 8},
        "batch_size": 4, "gradient_accumulation_steps": 1, "epochs": 4,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 2e-3},
        "loss": {"_component_": "engine.modules.loss.DPOLoss", "beta": 0.1},
        "save_every_n_steps": None, "keep_last_n_checkpoints": 1,
    }  # fmt: skip
    cfg.update(over)
    return cfg


def run(cfg):
    from engine.recipes.dpo import DPORecipe, check_config

    return train_in_process(DPORecipe, check_config, cfg)


def _mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


def test_full_dpo_accuracy_and_margin_rise(shared_assets, tmp_path):
    recipe = run(dpo_config(shared_assets, tmp_path))
    h = recipe.history
    assert len(h) == 8
    # Step 1: the policy equals the frozen reference, so every reward is 0 and the loss is log 2.
    assert h[0]["rewards/margin"] == pytest.approx(0.0, abs=1e-6)
    assert h[0]["loss"] == pytest.approx(0.6931, abs=1e-3)
    first, last = h[:2], h[-3:]
    assert _mean(last, "rewards/accuracy") >= 0.9 > _mean(first, "rewards/accuracy")
    assert _mean(last, "rewards/margin") > _mean(first, "rewards/margin") + 0.2
    assert _mean(last, "loss") < _mean(first, "loss") - 0.05
    assert (tmp_path / "checkpoints" / "step_8" / "model").is_dir()
    # The reference never moved.
    ref = dict(recipe.reference.named_parameters())
    assert all(not p.requires_grad for p in ref.values())


def test_lora_dpo_uses_the_adapter_free_base_as_reference(shared_assets, tmp_path):
    model = copy.deepcopy(TINY) | {
        "_component_": "engine.models.llama3.lora_llama3", "lora_rank": 8, "lora_alpha": 16,
        "lora_attn_modules": ["q_proj", "v_proj", "output_proj"], "apply_lora_to_mlp": True,
    }  # fmt: skip
    data = DEMO_PAIRS | {"n": 4}
    cfg = dpo_config(shared_assets, tmp_path, model=model, epochs=3, dataset=data,
                     optimizer={"_component_": "torch.optim.AdamW", "lr": 1e-2})  # fmt: skip
    recipe = run(cfg)
    assert recipe.reference is None and recipe.is_lora
    h = recipe.history
    # Step 1: adapters start at zero, so the policy IS the adapter-free reference: rewards 0, loss log 2.
    assert h[0]["rewards/margin"] == pytest.approx(0.0, abs=1e-6)
    assert h[0]["loss"] == pytest.approx(0.6931, abs=1e-4)
    assert h[-1]["rewards/margin"] > 0.01 and h[-1]["rewards/accuracy"] > 0.5
    assert h[-1]["loss"] < h[0]["loss"]
    # The base (the reference) never trains: only adapter parameters require grad.
    assert all(not p.requires_grad for n, p in recipe.model.named_parameters() if "lora" not in n)
    assert (tmp_path / "checkpoints" / "step_3" / "model" / "adapter_config.json").is_file()


def test_sft_dataset_is_refused_with_one_line(shared_assets, tmp_path):
    from engine.config import ConfigError

    cfg = dpo_config(
        shared_assets, tmp_path, dataset={"_component_": "engine.data.demo_dataset", "n": 8, "cache": False}
    )
    with pytest.raises(ConfigError, match="dataset: DPO needs preference pairs"):
        run(cfg)


def test_sequence_logps_equal_a_full_logits_reference():
    from engine.models.llama3 import llama3_tiny
    from engine.training.logprobs import token_logprobs

    torch.manual_seed(0)
    model = llama3_tiny()
    tokens = torch.randint(0, 256, (2, 9))
    labels = torch.cat([tokens[:, 1:], torch.full((2, 1), -100)], 1)
    labels[0, :3] = -100
    got = token_logprobs(model, tokens, labels, chunk_size=4)
    logp = torch.log_softmax(model(tokens).double(), -1)
    want = (
        torch.gather(logp, -1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1).masked_fill(labels == -100, 0)
    )
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(shared_assets, tmp_path):
    from safetensors.torch import load_file

    over = {"epochs": 1, "max_steps_per_epoch": 2, "save_every_n_steps": 1, "keep_last_n_checkpoints": 2}
    full = run(dpo_config(shared_assets, tmp_path / "full", **over))
    resumed = run(
        dpo_config(
            shared_assets, tmp_path / "resumed", resume=str(tmp_path / "full/checkpoints/step_1"), **over
        )
    )
    assert [h["loss"] for h in resumed.history] == pytest.approx([full.history[1]["loss"]], rel=1e-6)
    a = load_file(str(tmp_path / "full/checkpoints/step_2/model/model.safetensors"))
    b = load_file(str(tmp_path / "resumed/checkpoints/step_2/model/model.safetensors"))
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-6, atol=1e-7, msg=key)
