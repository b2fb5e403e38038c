"""Distillation: a 2-layer 32-dim student learns a 2-layer 64-dim teacher on demo rows (SmolLM2 tokenizer)."""

from __future__ import annotations

import pytest

from tests.engine.recipes._recipe_runner import train_in_process

BASE = {"_component_": "engine.models.llama3.llama3", "vocab_size": 49152, "num_layers": 2, "max_seq_len": 128,
        "rope_base": 10000.0}  # fmt: skip


def kd_config(assets, out, **over):
    cfg = {
        "output_dir": str(out), "seed": 0, "device": "cpu", "dtype": "fp32", "checkpoint_dir": None,
        "model": BASE | {"num_heads": 2, "num_kv_heads": 1, "embed_dim": 32, "intermediate_dim": 64},
        "teacher_checkpoint_dir": None,
        "teacher_model": BASE | {"num_heads": 4, "num_kv_heads": 2, "embed_dim": 64, "intermediate_dim": 128},
        "tokenizer": {"_component_": "engine.data.tokenizers.load_tokenizer", "path": str(assets / "tokenizers" / "smollm2")},
        # Plain text whatever the tokenizer folder holds (a bare clone's stand-in SmolLM2 has a chat
        # template; its system prompt and the question took up to 55 of the 48 tokens: "leaves no token
        # to train on").
        "dataset": {"_component_": "engine.data.demo_dataset", "n": 8, "max_seq_len": 48, "chat_format": None,
                    "cache": False},
        "batch_size": 2, "gradient_accumulation_steps": 2, "epochs": 4,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-2},
        "loss": {"_component_": "engine.modules.loss.KDLoss", "kind": "forward", "kd_ratio": 0.9, "chunk_size": 64},
        "keep_last_n_checkpoints": 1,
    }  # fmt: skip
    cfg.update(over)
    return cfg


def run(cfg):
    from engine.recipes.kd import KDRecipe, check_config

    return train_in_process(KDRecipe, check_config, cfg)


def test_kl_to_teacher_falls(shared_assets, tmp_path):
    recipe = run(kd_config(shared_assets, tmp_path))
    kd = [h["loss/kd"] for h in recipe.history]
    assert len(kd) == 8
    assert sum(kd[-2:]) / 2 < 0.7 * sum(kd[:2]) / 2, kd
    h = recipe.history[-1]
    assert h["loss"] == pytest.approx(0.9 * h["loss/kd"] + 0.1 * h["loss/ce"], rel=1e-5)
    assert all(not p.requires_grad for p in recipe.teacher.parameters())
    assert (tmp_path / "checkpoints" / "step_8" / "model").is_dir()


def test_vocabulary_mismatch_is_one_line(shared_assets, tmp_path):
    from engine.config import ConfigError

    cfg = kd_config(shared_assets, tmp_path)
    cfg["teacher_model"]["vocab_size"] = 1000
    with pytest.raises(ConfigError, match="teacher_model: vocabulary 1000 differs"):
        run(cfg)
