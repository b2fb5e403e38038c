"""bench/gpu.sh's CPU dry run (SMOKE=1): every row of both tables runs through the engine's training
step and is printed next to its published figure, and the JSON file has one record per row."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LLAMA = ["baseline", "+packing", "+compile", "+linear CE", "+AC", "+opt-in-bwd", "+offloading", "+AdamW8bit",
         "LoRA", "QLoRA"]  # fmt: skip
QWEN = ["baseline", "+compile", "+packing"]


def _smoke(tmp_path: Path, rows: str | None) -> tuple[str, dict]:
    env = dict(os.environ, SMOKE="1", PYTHONPATH=str(REPO))
    if rows:
        env["ROWS"] = rows
    out = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu.sh")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout, json.loads((REPO / "bench" / "out" / "gpu_sft.json").read_text())


def test_first_and_last_rows(tmp_path):
    """baseline: padded batches, [B,S,V] logits; QLoRA: every option but offloading stacked on an NF4 base."""
    stdout, data = _smoke(tmp_path, "llama:baseline,llama:qlora")
    assert data["smoke"] is True
    assert [(r["table"], r["row"]) for r in data["results"]] == [("llama", "baseline"), ("llama", "QLoRA")]
    qlora = data["results"][1]
    assert qlora["published_tokens_per_sec"] == 8035 and qlora["published_peak_gib"] == 4.6
    assert qlora["note"] == "without offloading (needs CUDA)"
    assert all(r["tokens_per_sec"] > 0 and r["loss"] == r["loss"] for r in data["results"])  # finite
    assert (
        "Llama 3.2 3B (torchtune's published A100 table)" in stdout
        and "Qwen3-0.6B (the seed's H100" in stdout
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 13 rows on CPU: ~2 min on an idle 2-core machine, >10 min under load
def test_every_row(tmp_path):
    stdout, data = _smoke(tmp_path, None)
    got = [(r["table"], r["row"]) for r in data["results"]]
    assert got == [("llama", r) for r in LLAMA] + [("qwen", r) for r in QWEN]
    published = {r["row"]: r["published_tokens_per_sec"] for r in data["results"] if r["table"] == "qwen"}
    assert published == {"baseline": 5200, "+compile": 7900, "+packing": 57000}
    for row in LLAMA + QWEN:
        assert any(line.startswith(f"{row:<14}") for line in stdout.splitlines()), row


def test_moe_row():
    """Row moe:step runs bench/moe_step.py (SMOKE=1: the tiny CPU shape, 2 rounds): tunebench's
    Qwen3-MoE step and transformers' two experts implementations from the same weights and tokens."""
    env = dict(os.environ, SMOKE="1", ROWS="moe:step", THREADS="1", PYTHONPATH=str(REPO))
    out = subprocess.run(
        ["bash", str(REPO / "bench" / "gpu.sh")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tunebench / transformers (default experts):" in out.stdout
    data = json.loads((REPO / "bench" / "out" / "moe_step_smoke.json").read_text())
    names = ["transformers", "transformers_eager", "tunebench"]
    assert sorted(data["tokens_per_s"]) == names and all(data["tokens_per_s"][n] > 0 for n in names)
    assert data["threads"] == 1
    first = data["first_step_loss"]  # same weights, same tokens: the same loss (fp32 sums, 1e-5)
    for name in names:
        assert abs(first[name] - first["tunebench"]) <= 1e-5 * abs(first["tunebench"]), (name, first)
