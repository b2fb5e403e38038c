"""DPO as a process: FSDP2 on 2 ranks equals 1 rank (losses and rewards per step, exported weights)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.engine.recipes._sft_helpers import REPO, new_run, recipe_env, write_config
from tests.engine.recipes.test_dpo import dpo_config, run


def _series(home, run_id, name):
    from engine.tracking import open_db
    from engine.tracking.readers import metric_series

    with open_db(home) as db:
        return [v for _, v in metric_series(run_id, name, db=db)]


@pytest.mark.distributed
def test_fsdp2_two_ranks_equal_one_rank(shared_assets, tmp_path, tunebench_home):
    over = {"epochs": 1, "max_steps_per_epoch": 2, "optimizer": {"_component_": "torch.optim.SGD", "lr": 0.5}}
    one = run(dpo_config(shared_assets, tmp_path / "one", batch_size=4, **over))
    cfg_path = write_config(
        dpo_config(shared_assets, tmp_path / "two", batch_size=2, **over), tmp_path / "cfg.yaml"
    )
    run_id = new_run(tunebench_home)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "engine.recipes.dpo", "--config", str(cfg_path)]  # fmt: skip
    done = subprocess.run(cmd, env=recipe_env(tunebench_home, run_id), cwd=REPO, capture_output=True, text=True,
                          timeout=400)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracy"):
        want = torch.tensor([h[name] for h in one.history])
        torch.testing.assert_close(
            torch.tensor(_series(tunebench_home, run_id, name)), want, rtol=1e-4, atol=1e-6
        )
    # The margin is chosen - rejected, two rewards that nearly cancel (0.0611 - 0.0594 at step 2), so its
    # error is the operands' error (rtol 1e-4 of |reward|), not a fraction of its own small size.
    chosen = torch.tensor([h["rewards/chosen"] for h in one.history])
    rejected = torch.tensor([h["rewards/rejected"] for h in one.history])
    bound = 1e-4 * torch.maximum(chosen.abs(), rejected.abs()).max().item() + 1e-6
    torch.testing.assert_close(
        torch.tensor(_series(tunebench_home, run_id, "rewards/margin")),
        torch.tensor([h["rewards/margin"] for h in one.history]),
        rtol=0,
        atol=bound,
    )
    got = load_file(str(tmp_path / "two" / "checkpoints" / "step_2" / "model" / "model.safetensors"))
    expected = load_file(str(tmp_path / "one" / "checkpoints" / "step_2" / "model" / "model.safetensors"))
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-6, msg=key)
