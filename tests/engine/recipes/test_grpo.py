"""Synchronous GRPO on the digit-successor task ("answer with the digit after X").

Task: prompt `<bos>X>`, reward 1 when the completion starts with (X+1) mod 10 (engine.rl.toy_task).
Policy: a randomly initialised 2-layer, 32-dim Llama over the task's 16-symbol vocabulary; 4 prompts x
G=8 completions of at most 2 tokens per step, temperature 1, 2 PPO epochs, AdamW lr 1e-2, KL 0.04 to a
frozen copy. Measured on CPU: mean reward 0.106 over the first 5 steps, 0.588
over the last 5 of 30 steps.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.engine.recipes._recipe_runner import train_in_process

TOY_MODEL = {
    "_component_": "engine.models.llama3.llama3",
    "vocab_size": 16, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "embed_dim": 32,
    "intermediate_dim": 64, "max_seq_len": 32, "rope_base": 10000.0,
}  # fmt: skip


def grpo_config(out, **over):
    cfg = {
        "output_dir": str(out), "seed": 0, "device": "cpu", "dtype": "fp32", "checkpoint_dir": None,
        "model": dict(TOY_MODEL),
        "tokenizer": {"_component_": "engine.rl.toy_task.DigitTokenizer"},
        "dataset": {"_component_": "engine.rl.toy_task.digit_successor_dataset", "n": 400, "seed": 0},
        "batch_size": 4, "group_size": 8, "max_new_tokens": 2, "temperature": 1.0,
        "rewards": {"correct": {"_component_": "engine.rl.toy_task.digit_successor_reward"}},
        "ppo_epochs": 2, "minibatch_size": 16, "epochs": 1, "max_steps_per_epoch": 30,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-2},
        "loss": {"_component_": "engine.modules.loss.GRPOLoss", "epsilon": 0.2, "kl_coeff": 0.04},
        "num_samples_to_log": 2, "save_every_n_steps": None, "keep_last_n_checkpoints": 1,
    }  # fmt: skip
    cfg.update(over)
    return cfg


def run(cfg):
    from engine.recipes.grpo import GRPORecipe, check_config

    return train_in_process(GRPORecipe, check_config, cfg)


def test_mean_reward_rises_on_digit_successor(tmp_path):
    recipe = run(grpo_config(tmp_path))
    r = [h["reward/mean"] for h in recipe.history]
    assert len(r) == 30
    start, end = sum(r[:5]) / 5, sum(r[-5:]) / 5
    print(f"reward first 5 steps {start:.3f}, last 5 steps {end:.3f}")
    assert start < 0.5
    assert end >= 0.4 and end > start + 0.3
    h = recipe.history[-1]
    for key in ("reward/std", "rewards/correct", "kl", "clip_fraction", "completion_length", "loss"):
        assert key in h
    assert h["kl"] > 0 and 1 <= h["completion_length"] <= 2
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 60 and {"prompt", "completion", "answer", "reward"} <= set(samples[0])
    assert (tmp_path / "checkpoints" / "step_30" / "model").is_dir()


def test_rollout_batch_labels_score_exactly_the_completion():
    from engine.rl.rollout import rollout_batch

    tokens, labels, mask = rollout_batch([[1, 5, 6], [1, 7]], [[8, 2], [9]], pad_id=0)
    assert tokens.tolist() == [[1, 5, 6, 8, 2], [1, 7, 9, 0, 0]]
    assert labels.tolist() == [[-100, -100, 8, 2, -100], [-100, 9, -100, -100, -100]]
    assert mask.sum().item() == 3


def test_user_reward_function_by_dotted_path_and_bad_reward(tmp_path):
    from engine.config import ConfigError
    from engine.rl.rollout import score

    total, per = score(
        {"fmt": {"_component_": "engine.rl.rewards.format_reward", "pattern": "^9"},
         "ok": {"_component_": "engine.rl.toy_task.digit_successor_reward"}},
        {"fmt": 0.5}, ["9", "3"], ["9", "9"], ["8>", "8>"],
    )  # fmt: skip
    torch.testing.assert_close(total, torch.tensor([1.5, 0.0]))
    assert per["fmt"].tolist() == [1.0, 0.0]
    with pytest.raises(ConfigError, match="not allowed|allowed_components"):
        score({"evil": {"_component_": "os.system"}}, {}, ["x"], ["y"], ["z"])
    with pytest.raises(ConfigError, match="reward_weights"):
        run(grpo_config(tmp_path, reward_weights={"typo": 1.0}))


def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(tmp_path):
    """The sampling generator, data position, optimizer and weights are restored: steps 3-4 repeat."""
    over = {"max_steps_per_epoch": 4, "save_every_n_steps": 2, "keep_last_n_checkpoints": 2}
    full = run(grpo_config(tmp_path / "full", **over))
    resumed = run(grpo_config(tmp_path / "resumed", resume=str(tmp_path / "full/checkpoints/step_2"), **over))
    assert [h["reward/mean"] for h in resumed.history] == [h["reward/mean"] for h in full.history[2:]]
    for (name, a), (_, b) in zip(
        full.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7, msg=name)


def test_lora_policy_uses_the_adapter_free_base_as_reference(tmp_path):
    """LoRA: no reference copy; on the first minibatch the policy equals the base, so the KL is 0."""
    model = dict(TOY_MODEL) | {"_component_": "engine.models.llama3.lora_llama3", "lora_rank": 4, "lora_alpha": 8,
                               "lora_attn_modules": ["q_proj", "v_proj"], "apply_lora_to_mlp": True}  # fmt: skip
    recipe = run(grpo_config(tmp_path, model=model, max_steps_per_epoch=2, ppo_epochs=1, minibatch_size=32))
    assert recipe.is_lora and recipe.reference is None
    assert recipe.history[0]["kl"] == pytest.approx(0.0, abs=1e-7)
    assert recipe.history[1]["kl"] > 0
    assert (tmp_path / "checkpoints" / "step_2" / "model" / "adapter_config.json").is_file()
