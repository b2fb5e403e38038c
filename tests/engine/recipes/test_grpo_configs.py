"""The built-in toy GRPO config runs end to end as a process; a bad value is one line and exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _run(args, home):
    env = dict(os.environ, TUNEBENCH_HOME=str(home), OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("TUNEBENCH_RUN_ID", None)
    return subprocess.run([sys.executable, "-m", "engine.recipes.grpo", "--config",
                           str(REPO / "configs/demo/digit_successor_grpo.yaml"), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip


def test_toy_grpo_config_runs_as_a_process(tmp_path):
    out = tmp_path / "run"
    proc = _run([f"output_dir={out}", "max_steps_per_epoch=3"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len((out / "samples.jsonl").read_text().splitlines()) == 12
    assert (out / "checkpoints" / "step_3").is_dir()


def test_bad_value_is_one_line_exit_2(tmp_path):
    proc = _run([f"output_dir={tmp_path / 'run'}", "minibatch_size=5"], tmp_path)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("grpo: minibatch_size: 5 does not divide"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_async_demo_trains_with_the_measured_synchronous_settings():
    """The async demo's header leans on the synchronous demo's measured curve (max_staleness=0 is that
    run): apart from `output_dir` and the keys only grpo_async declares, the two files are equal."""
    from engine.config import load_config
    from engine.recipes import grpo, grpo_async

    sync = load_config(REPO / "configs/demo/digit_successor_grpo.yaml")
    asyn = load_config(REPO / "configs/demo/digit_successor_grpo_async.yaml")
    async_only = set(grpo_async.CONFIG_SCHEMA.fields) - set(grpo.CONFIG_SCHEMA.fields)
    assert async_only and set(asyn) - set(sync) <= async_only
    for cfg in (sync, asyn):
        cfg.pop("output_dir")
    assert {k: v for k, v in asyn.items() if k not in async_only} == sync
