"""The real SFT recipe under torchrun on the meshes the default suite had not run it on, against the
same config in one plain process: per-step `loss` AND `grad_norm` from the tracker, and the exported
final weights.

- context parallel: cp=2 on 2 ranks (ring attention, packed documents, the recipe's sequence split);
- HSDP 2 x 2 on 4 ranks: parameters sharded over dp_shard=2 and replicated over dp_replicate=2;
- expert parallel with two expert groups: 4 ranks, dp_replicate=2 x dp_shard=2, expert_parallel_dim=2
  (each group holds the 8 experts once, 4 per rank), so `reduce_expert_grads` sums the groups.

Gradient clipping is OFF (`clip_grad_norm: null`, the norm is still measured and logged): a clip to
1.0 would rescale a gradient that is uniformly 2x too large back to the same update and hide it.
SGD with momentum keeps the update linear in the gradients. The config is self-contained (the
embedded SmolLM2 tokenizer, 24 rows written here, a 2-layer 64-dim model), so no shared assets.

Tolerances (fp32; only the order of the sums differs: each rank's rows in their own matmuls, ring
attention's online softmax, all_to_all regrouping): losses rtol 1e-5 (measured <= 1.4e-7); gradient
norms rtol 5e-5 (measured <= 7.9e-6; the gradients themselves agree far closer: the norm of the
one process is the less exact one, torch's fp32 `vector_norm` on CPU sums a whole [49152, 64]
output gradient in one pass, 3.5e-5 relative error on 3M uniform values, where FSDP2 sums
half-shards; expert gradients summed into the wrong parameter moved it by 2e-4 at step 1);
weights rtol 1e-4, atol 2e-6 (measured <= 1.2e-7 absolute).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.engine.recipes._sft_helpers import (
    REPO,
    TINY_MODEL,
    new_run,
    recipe_env,
    run_recipe,
    set_keys,
    write_config,
)

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

STEPS = 3
TOL = {"loss": {"rtol": 1e-5, "atol": 0.0}, "grad_norm": {"rtol": 5e-5, "atol": 0.0}}
WEIGHT_TOL = {"rtol": 1e-4, "atol": 2e-6}
WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()
)
MOE = {
    "_component_": "engine.models.qwen3_moe.qwen3_moe",
    "vocab_size": 49152,  # the SmolLM2 tokenizer's
    "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64, "head_dim": 16,
    "moe_intermediate_dim": 32, "num_experts": 8, "num_experts_per_tok": 2, "max_seq_len": 256,
    "router_aux_loss_coef": 0.1,
}  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the in-process reference runs like the 1-thread ranks
    yield
    torch.set_num_threads(before)


def _config(tmp_path: Path, name: str, **over) -> dict:
    """3 steps of 4 rows (global batch) on 24 generated instruction rows; clipping off."""
    rows = tmp_path / "rows.json"
    if not rows.exists():
        g = torch.Generator().manual_seed(0)
        pick = lambda n: " ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (n,), generator=g).tolist())  # noqa: E731
        rows.write_text(
            json.dumps([{"instruction": pick(4), "input": "", "output": pick(3 + i % 9)} for i in range(24)])
        )
    cfg = {
        "output_dir": str(tmp_path / name),
        "seed": 0, "device": "cpu", "dtype": "fp32", "checkpoint_dir": None,
        "model": dict(TINY_MODEL),
        "tokenizer": {"_component_": "engine.data.tokenizers.load_tokenizer", "path": "demo"},
        "dataset": {
            "_component_": "engine.data.instruct_dataset", "source": str(rows),
            "template": "engine.data.AlpacaInstructTemplate", "max_seq_len": 40, "cache": False,
        },
        "batch_size": 4, "epochs": 1, "max_steps_per_epoch": STEPS, "shuffle": False,
        "optimizer": {"_component_": "torch.optim.SGD", "lr": 0.2, "momentum": 0.9},
        "clip_grad_norm": None,  # measured and logged, never applied
        "loss": {"_component_": "engine.modules.loss.LinearCrossEntropyLoss"},
    }  # fmt: skip
    return set_keys(cfg, over)


def _series(home: Path, run_id: str, name: str) -> list[tuple[int, float]]:
    from engine.tracking import open_db
    from engine.tracking.readers import metric_series

    with open_db(home) as db:
        return metric_series(run_id, name, db=db)


def _one_process(tmp_path: Path, home: Path, monkeypatch, cfg: dict) -> dict[str, list[float]]:
    """The reference: `cfg` trained in this process, its metrics written to a tracker row."""
    run_id = new_run(home)
    monkeypatch.setenv("TUNEBENCH_RUN_ID", run_id)
    try:
        run_recipe(cfg)
    finally:
        monkeypatch.delenv("TUNEBENCH_RUN_ID")
    return _metrics(home, run_id)


def _metrics(home: Path, run_id: str) -> dict[str, list[float]]:
    out = {}
    for name in ("loss", "grad_norm"):
        rows = _series(home, run_id, name)
        assert [s for s, _ in rows] == list(range(1, STEPS + 1)), (name, rows)
        out[name] = [v for _, v in rows]
    return out


def _torchrun(
    tmp_path: Path, home: Path, cfg: dict, nproc: int, mesh: str
) -> tuple[dict[str, list[float]], str]:
    """`cfg` through `torchrun --nproc_per_node nproc -m engine.recipes.sft`; its metrics and stdout."""
    path = write_config(cfg, tmp_path / f"{Path(cfg['output_dir']).name}.yaml")
    run_id = new_run(home)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "engine.recipes.sft", "--config", str(path)]  # fmt: skip
    done = subprocess.run(
        cmd, env=recipe_env(home, run_id), cwd=REPO, capture_output=True, text=True, timeout=840
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    from engine.tracking import open_db
    from engine.tracking.readers import events_since

    with open_db(home) as db:
        assert [e.text for e in events_since(run_id, db=db) if e.kind == "mesh"] == [mesh]
    return _metrics(home, run_id), done.stdout


def _final_weights(cfg: dict) -> dict[str, torch.Tensor]:
    return load_file(
        str(Path(cfg["output_dir"]) / "checkpoints" / f"step_{STEPS}" / "model" / "model.safetensors")
    )


def _assert_same(got: dict, want: dict, got_cfg: dict, want_cfg: dict) -> None:
    for name in ("loss", "grad_norm"):
        torch.testing.assert_close(
            torch.tensor(got[name]), torch.tensor(want[name]), **TOL[name], msg=lambda m, n=name: f"{n}: {m}"
        )
    got_w, want_w = _final_weights(got_cfg), _final_weights(want_cfg)
    assert set(got_w) == set(want_w)
    for key, value in want_w.items():
        torch.testing.assert_close(got_w[key], value, **WEIGHT_TOL, msg=lambda m, k=key: f"{k}: {m}")


PACKED = {"dataset.packed": True, "dataset.max_seq_len": 48}


def test_context_parallel_and_hsdp_2x2_equal_one_process(tmp_path, tunebench_home, monkeypatch):
    # One reference for both: 3 steps of 4 packed rows of 48 tokens.
    one_cfg = _config(tmp_path, "one", **PACKED)
    one = _one_process(tmp_path, tunebench_home, monkeypatch, one_cfg)
    assert all(n > 0 for n in one["grad_norm"])

    # cp=2: both ranks take the same 4 rows, each its load-balanced half of every sequence.
    cp_cfg = _config(tmp_path, "cp", **PACKED, context_parallel_dim=2)
    cp, _ = _torchrun(tmp_path, tunebench_home, cp_cfg, 2, "dp_replicate=1 x dp_shard=1 x cp=2 x tp=1")
    _assert_same(cp, one, cp_cfg, one_cfg)

    # HSDP 2 x 2: 4 data-parallel ranks, one row each; FSDP2 shards over dp_shard, replicates over
    # dp_replicate (gradients reduce-scattered in a shard group, then all-reduced across the replicas).
    hsdp_cfg = _config(tmp_path, "hsdp", **PACKED, batch_size=1, data_parallel_replicate_dim=2,
                       data_parallel_shard_dim=2)  # fmt: skip
    hsdp, _ = _torchrun(tmp_path, tunebench_home, hsdp_cfg, 4, "dp_replicate=2 x dp_shard=2 x cp=1 x tp=1")
    _assert_same(hsdp, one, hsdp_cfg, one_cfg)


def test_expert_parallel_with_two_expert_groups_equals_one_process(tmp_path, tunebench_home, monkeypatch):
    # 4 ranks: EP groups {0,1} and {2,3} (4 of the 8 experts per rank); each rank one row of 4.
    one_cfg = _config(tmp_path, "one", model=dict(MOE))
    one = _one_process(tmp_path, tunebench_home, monkeypatch, one_cfg)
    ep_cfg = _config(tmp_path, "ep", model=dict(MOE), batch_size=1, data_parallel_replicate_dim=2,
                     data_parallel_shard_dim=2, expert_parallel_dim=2)  # fmt: skip
    ep, stdout = _torchrun(tmp_path, tunebench_home, ep_cfg, 4, "dp_replicate=2 x dp_shard=2 x cp=1 x tp=1")
    assert "expert parallel: 8 experts over 2 ranks (4 per rank)" in stdout
    _assert_same(ep, one, ep_cfg, one_cfg)
    assert any(".experts.7." in k for k in _final_weights(ep_cfg))  # every expert came back from its rank
