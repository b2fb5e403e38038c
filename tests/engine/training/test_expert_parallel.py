"""Expert parallelism: bad settings are one line before anything starts, and on gloo 2 ranks with
`expert_parallel_dim: 2` (each holding 4 of 8 experts, tokens exchanged with all_to_all) give the
same per-step losses and final weights as 1 rank, for full fine-tuning (also with activation
checkpointing, and with compiled blocks) and LoRA on the experts."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from engine.training.expert_parallel import expert_parallel_problems
from tests.engine.recipes._sft_helpers import (
    REPO,
    losses,
    new_run,
    recipe_env,
    run_recipe,
    tiny_config,
    write_config,
)

MOE = {
    "_component_": "engine.models.qwen3_moe.qwen3_moe",
    "vocab_size": 49152,
    "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64, "head_dim": 16,
    "moe_intermediate_dim": 32, "num_experts": 8, "num_experts_per_tok": 2, "max_seq_len": 256,
    "router_aux_loss_coef": 0.1,
}  # fmt: skip


def _problem(cfg, world):
    problems = expert_parallel_problems(cfg, world)
    return str(problems[0]) if problems else None


def test_bad_settings_are_one_line():
    moe = {"model": dict(MOE)}
    assert _problem({**moe, "expert_parallel_dim": 2}, 2) is None
    assert _problem({**moe, "expert_parallel_dim": 1}, 3) is None
    assert "does not divide the 3 ranks" in _problem({**moe, "expert_parallel_dim": 2}, 3)
    assert "does not divide the model's 8 experts" in _problem({**moe, "expert_parallel_dim": 3}, 3)
    dense = {"model": {"_component_": "engine.models.qwen3.qwen3_tiny"}, "expert_parallel_dim": 2}
    assert "dense" in _problem(dense, 2)
    assert "tensor" in _problem({**moe, "expert_parallel_dim": 2, "tensor_parallel_dim": 2}, 4)
    assert "positive integer" in _problem({**moe, "expert_parallel_dim": 0}, 2)
    for line in filter(None, [_problem(dense, 2), _problem({**moe, "expert_parallel_dim": 2}, 3)]):
        assert "\n" not in line and line.startswith("expert_parallel_dim")


def test_launcher_refuses_before_a_run_is_registered(tmp_path):
    from workbench.errors import UserError
    from workbench.launcher import _check_nproc

    dense = {"model": {"_component_": "engine.models.qwen3.qwen3_tiny"}, "expert_parallel_dim": 2}
    with pytest.raises(UserError, match="expert_parallel_dim: the model is dense"):
        _check_nproc("sft", 2, dense)


SGD = {"_component_": "torch.optim.SGD", "lr": 0.5, "momentum": 0.9}


def _final(output_dir, step):
    folder = output_dir / "checkpoints" / f"step_{step}" / "model"
    name = (
        "adapter_model.safetensors"
        if (folder / "adapter_model.safetensors").is_file()
        else "model.safetensors"
    )
    return load_file(str(folder / name))


# The cases: full fine-tuning; with activation checkpointing (each block's forward, all_to_all
# included, recomputed in backward on both ranks alike); with every block compiled (the token
# exchange runs eagerly between the compiled graphs); LoRA on the experts with checkpointing.
CASES = {
    "full": {},
    "full_ac": {"enable_activation_checkpointing": True},
    "full_compile": {"compile": True},
    "lora_ac": {"enable_activation_checkpointing": True},
}


@pytest.mark.distributed
@pytest.mark.parametrize(
    "case",
    [
        "full",
        pytest.param("full_ac", marks=pytest.mark.slow),
        pytest.param("full_compile", marks=pytest.mark.slow),
        pytest.param("lora_ac", marks=pytest.mark.slow),
    ],
)
def test_two_ranks_expert_parallel_equal_one_rank(case, shared_assets, tmp_path, tunebench_home):
    model = dict(MOE)
    if case.startswith("lora"):
        model.update(
            _component_="engine.models.qwen3_moe.lora_qwen3_moe", lora_rank=4, lora_alpha=8.0,
            apply_lora_to_experts=True, train_router=True,
        )  # fmt: skip
    over = dict(model=model, max_steps_per_epoch=3, optimizer=dict(SGD), clip_grad_norm=1.0, **CASES[case])
    torch.set_num_threads(1)
    one = run_recipe(tiny_config(shared_assets, tmp_path / "one", batch_size=4, **over))
    cfg = tiny_config(shared_assets, tmp_path / "two", batch_size=2, **over)
    cfg["expert_parallel_dim"] = 2
    cfg_path = write_config(cfg, tmp_path / "cfg.yaml")
    run_id = new_run(tunebench_home)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "engine.recipes.sft", "--config", str(cfg_path)]  # fmt: skip
    done = subprocess.run(
        cmd, env=recipe_env(tunebench_home, run_id), cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "expert parallel: 8 experts over 2 ranks (4 per rank)" in done.stdout
    two = [v for _, v in losses(tunebench_home, run_id)]
    # Tolerance: fp32 sums in another order (two ranks, all_to_all regrouping) — rtol 1e-5 on losses.
    torch.testing.assert_close(torch.tensor(two), torch.tensor(one.loss_history), rtol=1e-5, atol=0)
    got, expected = _final(tmp_path / "two", 3), _final(tmp_path / "one", 3)
    assert set(got) == set(expected)
    assert any(".experts.7." in k for k in got)  # every expert came back from its rank
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-6, msg=key)
