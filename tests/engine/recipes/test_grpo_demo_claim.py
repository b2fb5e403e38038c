"""The shipped GRPO demo config (`configs/demo/digit_successor_grpo.yaml`) learns as its header says.

The file is run as shipped; only `output_dir` (a temporary folder) and, for the other seeds, `seed`
are overridden. The header's claim, checked for seeds 0, 1 and 2: the mean reward over the first
quarter of the steps well below the last quarter's, and the last quarter's at least 0.5 (measured,
2026-12-02: first quarter 0.32/0.23/0.26, last quarter 0.84/0.65/0.65). Slow (50 steps per seed;
about a minute each on a free CPU core, half an hour at load 20); the default suite runs the same file
for 3 steps as a process (test_grpo_configs.py) and for 2 steps below.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.recipes.test_grpo import run

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "demo" / "digit_successor_grpo.yaml"


def _rewards(tmp_path: Path, seed: int) -> list[float]:
    from engine.config import load_config

    cfg = load_config(CONFIG, [f"output_dir={tmp_path / f'seed{seed}'}", f"seed={seed}"])
    return [h["reward/mean"] for h in run(cfg).history]


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shipped_config_learns_as_its_header_says(tmp_path, monkeypatch, seed):
    monkeypatch.delenv("TUNEBENCH_RUN_ID", raising=False)
    r = _rewards(tmp_path, seed)
    q = len(r) // 4
    first, last = sum(r[:q]) / q, sum(r[-q:]) / q
    print(f"seed {seed}: mean reward first quarter {first:.3f}, last quarter {last:.3f}")
    assert len(r) == 50
    assert r[0] < 0.25  # chance is 0.1
    assert last >= 0.5 and last > first + 0.25, (first, last)


def test_tokens_per_sec_counts_the_steps_sequences(tmp_path, monkeypatch):
    """`tokens_per_sec` (the progress line's figure) x `step_time` = prompt + completion tokens of the
    step's R = batch_size x group_size sequences: every digit prompt has the same length."""
    from engine.config import load_config

    monkeypatch.delenv("TUNEBENCH_RUN_ID", raising=False)
    cfg = load_config(CONFIG, [f"output_dir={tmp_path}", "max_steps_per_epoch=2", "num_samples_to_log=0"])
    recipe = run(cfg)
    rows = cfg["batch_size"] * cfg["group_size"]
    prompt_lens = set()
    for h in recipe.history:
        tokens = h["tokens_per_sec"] * h["step_time"]
        per_prompt = (tokens - h["completion_length"] * rows) / rows
        assert per_prompt == pytest.approx(round(per_prompt), abs=1e-3)
        prompt_lens.add(round(per_prompt))
    assert len(prompt_lens) == 1 and prompt_lens.pop() >= 2  # <bos> X > ...
