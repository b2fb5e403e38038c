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
            pair_rewards(reloaded, batch, 0), pair_rewards(recipe.model, batch, 0), atol=1e-5, rtol=0
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


def _transformers_rewards(folder, batch: dict) -> torch.Tensor:
    """`[2B]` rewards of a collated pair batch from transformers' own `*ForSequenceClassification` on
    `folder`, fed the padded rows as they are: it finds each row's last token by `pad_token_id`."""
    import transformers

    hf = transformers.AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    tokens = torch.cat([batch["chosen_tokens"], batch["rejected_tokens"]])
    attention = torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]])
    with torch.no_grad():
        return hf(tokens, attention_mask=attention.long()).logits[:, 0]


def test_reward_model_from_a_causal_lm_saves_pad_token_id_for_transformers(tmp_path):
    """From a causal LM's folder (its config.json has no pad_token_id): the saved reward model's
    config.json names the tokenizer's pad id, and transformers' LlamaForSequenceClassification on it
    gives the recipe's rewards on padded batches of rows of different lengths (<= 1e-5, fp32)."""
    pytest.importorskip("transformers")
    from engine.checkpoint import save_pretrained
    from engine.config import instantiate
    from engine.recipes.reward_model import pair_rewards

    torch.manual_seed(0)
    base = save_pretrained(instantiate(copy.deepcopy(TINY_DECODER)), tmp_path / "base")
    assert "pad_token_id" not in json.loads((base / "config.json").read_text())
    recipe = run(rm_config(tmp_path / "run", checkpoint_dir=str(base), epochs=1, max_steps_per_epoch=3,
                           validation=None))  # fmt: skip
    folder = tmp_path / "run" / "checkpoints" / "step_3" / "model"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"]
    assert config["pad_token_id"] == recipe.tokenizer.pad_id == 0
    from engine.data.collate import padded_collate_dpo
    from engine.rl.toy_preferences import digit_preference_dataset

    recipe.model.eval()
    for seed in (1, 2):  # prompts of 1 to 4 digits in one batch: rows of different lengths, padded
        rows = [digit_preference_dataset(recipe.tokenizer, n=2, distractors=d, seed=seed)[i] for d in range(4)
                for i in range(2)]  # fmt: skip
        batch = padded_collate_dpo(rows, pad_id=recipe.tokenizer.pad_id)
        assert not batch["chosen_attention_mask"].all()
        with torch.no_grad():
            ours = pair_rewards(recipe.model, batch, recipe.tokenizer.pad_id)
        torch.testing.assert_close(_transformers_rewards(folder, batch), ours, atol=1e-5, rtol=0)


def test_rewards_sit_where_transformers_reads_them_when_pad_is_eos(tmp_path):
    """A tokenizer that pads with its EOS (SmolLM2's <|im_end|>): transformers reads each row's reward
    at its last non-pad token, the one before the final EOS; `pair_rewards` reads the same one."""
    pytest.importorskip("transformers")
    from engine.checkpoint import save_pretrained
    from engine.config import instantiate
    from engine.data.collate import padded_collate_dpo
    from engine.recipes.reward_model import pair_rewards

    torch.manual_seed(0)
    model = instantiate(
        {"_component_": "engine.models.reward.reward_model", "decoder": copy.deepcopy(TINY_DECODER)}
    )
    eos = 2
    folder = save_pretrained(model, tmp_path / "rm", config_updates={"pad_token_id": eos})
    pairs = [
        {"chosen_tokens": [1, 5, 6, 7, eos], "chosen_labels": [-100, 6, 7, eos, -100],
         "rejected_tokens": [1, 5, 8, eos], "rejected_labels": [-100, 8, eos, -100]},
        {"chosen_tokens": [1, 9, eos], "chosen_labels": [-100, eos, -100],
         "rejected_tokens": [1, 9, 4, 4, 3, eos], "rejected_labels": [-100, 4, 4, 3, eos, -100]},
    ]  # fmt: skip
    batch = padded_collate_dpo(pairs, pad_id=eos)
    with torch.no_grad():
        ours = pair_rewards(model.eval(), batch, eos)
        scores = model(torch.cat([batch["chosen_tokens"], batch["rejected_tokens"]]))[..., 0]  # [4,S]
    torch.testing.assert_close(_transformers_rewards(folder, batch), ours, atol=1e-5, rtol=0)
    before_eos = torch.tensor([3, 1, 2, 4])  # each row's token before its EOS
    torch.testing.assert_close(ours, scores[torch.arange(4), before_eos])
