"""Shared by the SFT recipe tests: a tiny config on the real alpaca-cleaned-1k rows, running the recipe."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from tests.engine.recipes._recipe_runner import train_in_process

TINY_MODEL = {
    "_component_": "engine.models.llama3.llama3",
    "vocab_size": 49152,  # the SmolLM2 tokenizer's
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "embed_dim": 64,
    "intermediate_dim": 128,
    "max_seq_len": 256,
    "rope_base": 10000.0,
}


def tiny_config(assets: Path, output_dir: Path, **overrides) -> dict:
    """A 2-layer, 64-dim Llama on alpaca-cleaned-1k (SmolLM2 tokenizer), fp32, CPU."""
    cfg = {
        "output_dir": str(output_dir),
        "seed": 0,
        "device": "cpu",
        "dtype": "fp32",
        "checkpoint_dir": None,
        "model": copy.deepcopy(TINY_MODEL),
        "tokenizer": {
            "_component_": "engine.data.tokenizers.load_tokenizer",
            "path": str(assets / "tokenizers" / "smollm2"),
        },
        "dataset": {
            "_component_": "engine.data.instruct_dataset",
            "source": str(assets / "data" / "alpaca_data_cleaned_1000.json"),
            "template": "engine.data.AlpacaInstructTemplate",
            "max_seq_len": 48,
        },
        "batch_size": 4,
        "gradient_accumulation_steps": 1,
        "epochs": 1,
        "max_steps_per_epoch": 6,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 3e-3, "weight_decay": 0.01},
        "lr_scheduler": {"_component_": "engine.training.cosine_schedule_with_warmup", "num_warmup_steps": 2},
        "clip_grad_norm": None,
        "loss": {"_component_": "engine.modules.loss.LinearCrossEntropyLoss"},
        "save_every_n_steps": None,
        "keep_last_n_checkpoints": 2,
    }
    return set_keys(cfg, overrides)


def set_keys(cfg: dict, overrides: dict) -> dict:
    """Set dotted keys (`dataset.max_seq_len`) of `cfg` in place; returns it."""
    for key, value in overrides.items():
        node = cfg
        *parents, last = key.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return cfg


def run_recipe(cfg: dict):
    """Set up and train in this process (as `python -m engine.recipes.sft` does); returns the recipe."""
    from engine.recipes.sft import SFTRecipe, check_config

    return train_in_process(SFTRecipe, check_config, cfg)


def trainable_state(recipe) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in recipe.model.named_parameters() if v.requires_grad}


REPO = Path(__file__).resolve().parents[3]


def write_config(cfg: dict, path: Path) -> Path:
    from engine.config import dump_config

    path.write_text("# tunebench run sft --config " + path.name + "\n" + dump_config(cfg))
    return path


def recipe_env(home: Path, run_id: str | None = None) -> dict:
    """The environment the launcher gives a recipe (one thread per rank on this small machine)."""
    import os

    env = dict(os.environ, TUNEBENCH_HOME=str(home), OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("TUNEBENCH_RUN_ID", None)
    if run_id is not None:
        env["TUNEBENCH_RUN_ID"] = run_id
    return env


def new_run(home: Path) -> str:
    from engine.tracking import open_db
    from engine.tracking.run_rows import create_run

    with open_db(home) as db:
        return create_run(db=db, recipe="sft", config_text="{}").id


def losses(home: Path, run_id: str) -> list[tuple[int, float]]:
    from engine.tracking import open_db
    from engine.tracking.readers import metric_series

    with open_db(home) as db:
        return metric_series(run_id, "loss", db=db)
