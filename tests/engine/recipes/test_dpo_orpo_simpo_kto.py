"""ORPO, SimPO and KTO through the DPO recipe on the synthetic digit preferences (tiny Llama, CPU):
the preference accuracy rises over a short run; reference-free losses build no reference."""

from __future__ import annotations

import pytest
import torch

from tests.engine.recipes._recipe_runner import train_in_process

TINY = {
    "_component_": "engine.models.llama3.llama3",
    "vocab_size": 16, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64,
    "intermediate_dim": 128, "max_seq_len": 32, "rope_base": 10000.0,
}  # fmt: skip

LOSSES = {
    "orpo": {"_component_": "engine.modules.loss.ORPOLoss", "beta": 0.5},
    "simpo": {"_component_": "engine.modules.loss.SimPOLoss", "beta": 2.0, "gamma": 0.5},
    "kto": {"_component_": "engine.modules.loss.KTOLoss", "beta": 0.5},
}


def config(out, loss, **over):
    cfg = {
        "output_dir": str(out), "seed": 0, "device": "cpu", "dtype": "fp32", "checkpoint_dir": None,
        "model": dict(TINY), "tokenizer": {"_component_": "engine.rl.toy_task.DigitTokenizer"},
        "dataset": {"_component_": "engine.rl.toy_preferences.digit_preference_dataset", "n": 480, "distractors": 1},
        "batch_size": 16, "gradient_accumulation_steps": 1, "epochs": 1,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 3e-3, "weight_decay": 0.0},
        "loss": dict(LOSSES[loss]), "save_every_n_steps": None, "keep_last_n_checkpoints": 1,
    }  # fmt: skip
    cfg.update(over)
    return cfg


def run(cfg):
    from engine.recipes.dpo import DPORecipe, check_config

    return train_in_process(DPORecipe, check_config, cfg)


@pytest.mark.parametrize(
    "loss",  # ~40 s each on 2 loaded cores: KTO (which has the most moving parts) runs by default
    [pytest.param("orpo", marks=pytest.mark.slow), pytest.param("simpo", marks=pytest.mark.slow), "kto"],
)
def test_preference_accuracy_rises(loss, tmp_path):
    recipe = run(config(tmp_path, loss))
    h = recipe.history
    assert len(h) == 30
    first = sum(r["rewards/accuracy"] for r in h[:5]) / 5
    last = sum(r["rewards/accuracy"] for r in h[-5:]) / 5
    assert last >= first + 0.2 and last >= 0.75, (first, last)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in h)
    if loss == "kto":
        assert recipe.reference is not None and all(r["kl"] >= 0 for r in h)
    else:
        assert recipe.reference is None  # reference-free: no copy built, no reference pass


def test_kto_mismatched_pairs_swap_responses():
    from engine.modules.loss.kto_loss import mismatched_pairs

    # rows: prompt [1,5,6] + response [7,2] and prompt [1,8] + response [9,10,2]; pad 0
    tokens = torch.tensor([[1, 5, 6, 7, 2, 0], [1, 8, 9, 10, 2, 0]])
    labels = torch.tensor([[-100, -100, 7, 2, -100, -100], [-100, 9, 10, 2, -100, -100]])
    t, lab = mismatched_pairs(tokens, labels, 0)
    assert t.tolist() == [[1, 5, 6, 9, 10, 2], [1, 8, 7, 2, 0, 0]]
    assert lab.tolist() == [[-100, -100, 9, 10, 2, -100], [-100, 7, 2, -100, -100, -100]]


def test_paired_kto_refuses_one_pair_per_micro_batch(tmp_path):
    # one pair: rows [chosen; rejected], so the "mismatched" row would be the same prompt's other answer
    from engine.config import ConfigError
    from engine.recipes.dpo import DPORecipe, check_config

    with pytest.raises(ConfigError, match=r"batch_size: KTO needs >= 2 pairs per micro-batch, got 1"):
        train_in_process(DPORecipe, check_config, config(tmp_path, "kto", batch_size=1), train=False)
