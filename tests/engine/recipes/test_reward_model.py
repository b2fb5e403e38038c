"""Reward-model recipe on the synthetic digit preferences (prompts never seen in training are held
out), a tiny Llama with a score head, CPU."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from tests.engine.recipes._recipe_runner import train_in_process

TINY_DECODER = {
    "_component_": "engine.models.llama3.llama3",
    "vocab_size": 16, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64,
    "intermediate_dim": 128, "max_seq_len": 32, "rope_base": 10000.0,
}  # fmt: skip


def rm_config(out, **over):
    cfg = {
        "output_dir": str(out), "seed": 0, "device": "cpu", "dtype": "fp32", "checkpoint_dir": None,
        "model": {"_component_": "engine.models.reward.reward_model", "decoder": copy.deepcopy(TINY_DECODER)},
        "tokenizer": {"_component_": "engine.rl.toy_task.DigitTokenizer"},
        "dataset": {"_component_": "engine.rl.toy_preferences.digit_preference_dataset", "n": 1200, "seed": 0},
        "validation": {"fraction": 0.2, "every_n_steps": 1000},
        "batch_size": 32, "gradient_accumulation_steps": 1, "epochs": 4,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 3e-3, "weight_decay": 0.0},
        "loss": {"_component_": "engine.modules.loss.BradleyTerryLoss"},
        "save_every_n_steps": None, "keep_last_n_checkpoints": 1,
    }  # fmt: skip
    cfg.update(over)
    return cfg


def run(cfg):
    from engine.recipes.reward_model import RewardModelRecipe, check_config

    return train_in_process(RewardModelRecipe, check_config, cfg)


@pytest.mark.slow  # ~80 s on 2 loaded cores: 150 steps of 32 pairs
def test_held_out_accuracy_reaches_095(tmp_path):
    recipe = run(rm_config(tmp_path))
    h = recipe.history
    assert h[0]["accuracy"] < 0.75  # starts near chance
    final = recipe.val_history[-1]
    assert final["val_accuracy"] >= 0.95, final
    assert final["val_margin"] > 0
    # the checkpoint's model/ is a *ForSequenceClassification folder that loads back to the same rewards
    from engine.models import from_pretrained
    from engine.recipes.reward_model import pair_rewards

    folder = sorted((tmp_path / "checkpoints").iterdir())[-1] / "model"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"]
    reloaded = from_pretrained(folder)
    batch = next(iter(recipe.val_loader))
    with torch.no_grad():
        recipe.model.eval()
        torch.testing.assert_close(
            pair_rewards(reloaded, batch), pair_rewards(recipe.model, batch), atol=1e-5, rtol=0
        )


def test_lora_trains_adapters_and_the_head(tmp_path):
    model = {
        "_component_": "engine.models.reward.reward_model",
        "decoder": {
            **copy.deepcopy(TINY_DECODER),
            "_component_": "engine.models.llama3.lora_llama3",
            "lora_rank": 4,
        },
    }
    recipe = run(rm_config(tmp_path, model=model, epochs=1, max_steps_per_epoch=3, validation=None))
    trained = {n for n, p in recipe.model.named_parameters() if p.requires_grad}
    assert "score.weight" in trained and any("lora_a" in n for n in trained)
    assert not any(n.endswith("q_proj.weight") for n in trained)
    assert len(recipe.history) == 3


def test_not_a_reward_model_is_one_config_error(tmp_path):
    from engine.config import ConfigError

    with pytest.raises(ConfigError, match="score head"):
        run(rm_config(tmp_path, model=copy.deepcopy(TINY_DECODER)))
