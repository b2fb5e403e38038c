"""The SFT recipe under torchrun with each parallel degree of the mesh equals the same config on one
process: per-step losses (from the tracker) and the exported final weights.

The config is self-contained (the embedded SmolLM2 tokenizer, 24 rows written here, a 2-layer
64-dim Llama built from its sizes), so these run without the shared assets. SGD with momentum keeps
the update linear in the gradients (Adam would amplify last-bit differences of tiny gradients).
"""

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.engine.recipes._sft_helpers import (
    REPO,
    TINY_MODEL,
    losses,
    new_run,
    recipe_env,
    run_recipe,
    set_keys,
    write_config,
)
from tests.engine.recipes.test_sft_process import _run

STEPS = 3
WORDS = (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()
)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the in-process reference runs like the 1-thread ranks
    yield
    torch.set_num_threads(before)


def _config(tmp_path, name: str, **over) -> dict:
    rows = tmp_path / "rows.json"
    if not rows.exists():
        g = torch.Generator().manual_seed(0)
        pick = lambda n: " ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (n,), generator=g).tolist())  # noqa: E731
        data = [{"instruction": pick(4), "input": "", "output": pick(3 + i % 9)} for i in range(24)]
        rows.write_text(json.dumps(data))
    cfg = {
        "output_dir": str(tmp_path / name),
        "seed": 0,
        "device": "cpu",
        "dtype": "fp32",
        "checkpoint_dir": None,
        "model": dict(TINY_MODEL),
        "tokenizer": {"_component_": "engine.data.tokenizers.load_tokenizer", "path": "demo"},
        "dataset": {
            "_component_": "engine.data.instruct_dataset",
            "source": str(rows),
            "template": "engine.data.AlpacaInstructTemplate",
            "max_seq_len": 40,
            "cache": False,
        },
        "batch_size": 4,
        "epochs": 1,
        "max_steps_per_epoch": STEPS,
        "shuffle": False,
        "optimizer": {"_component_": "torch.optim.SGD", "lr": 0.5, "momentum": 0.9},
        "clip_grad_norm": 1.0,
        "loss": {"_component_": "engine.modules.loss.LinearCrossEntropyLoss"},
    }
    return set_keys(cfg, over)


def _two_ranks(tmp_path, tunebench_home, cfg: dict, mesh: str) -> list[float]:
    path = write_config(cfg, tmp_path / f"{cfg['output_dir'].rsplit('/', 1)[-1]}.yaml")
    run_id = new_run(tunebench_home)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "engine.recipes.sft", "--config", str(path)]  # fmt: skip
    done = _run(cmd, recipe_env(tunebench_home, run_id), timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    from engine.tracking import open_db
    from engine.tracking.readers import events_since

    with open_db(tunebench_home) as db:
        assert [e.text for e in events_since(run_id, db=db) if e.kind == "mesh"] == [mesh]
    return [v for _, v in losses(tunebench_home, run_id)]


def _weights(cfg: dict, step: int = STEPS) -> dict[str, torch.Tensor]:
    from pathlib import Path

    folder = Path(cfg["output_dir"]) / "checkpoints" / f"step_{step}" / "model"
    return load_file(str(folder / "model.safetensors"))


def _same_run(tmp_path, tunebench_home, one_over: dict, two_over: dict, mesh: str, *, rtol=2e-5):
    one_cfg = _config(tmp_path, "one", **one_over)
    one = run_recipe(one_cfg)
    two_cfg = _config(tmp_path, "two", **two_over)
    two = _two_ranks(tmp_path, tunebench_home, two_cfg, mesh)
    assert len(two) == STEPS
    torch.testing.assert_close(torch.tensor(two), torch.tensor(one.loss_history), rtol=rtol, atol=0)
    got, expected = _weights(two_cfg), _weights(one_cfg)
    assert set(got) == set(expected)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=2e-6, msg=key)


@pytest.mark.distributed
def test_tp_sequence_and_loss_parallel_equal_one_rank(tmp_path, tunebench_home):
    # tp=2: the two ranks share each batch; sequences padded to even lengths; vocab-parallel CE
    # replaces the configured linear CE (the output is untied).
    mesh = "dp_replicate=1 x dp_shard=1 x cp=1 x tp=2; loss parallel (vocab-sharded logits)"
    _same_run(tmp_path, tunebench_home, {}, {"tensor_parallel_dim": 2}, mesh)


@pytest.mark.distributed
@pytest.mark.slow  # the ring itself is in the default suite (parallel_worker cp); this adds the recipe's split
def test_context_parallel_packed_equals_one_rank(tmp_path, tunebench_home):
    packed = {"dataset.packed": True, "dataset.max_seq_len": 48, "batch_size": 2}
    mesh = "dp_replicate=1 x dp_shard=1 x cp=2 x tp=1"
    _same_run(tmp_path, tunebench_home, packed, {**packed, "context_parallel_dim": 2}, mesh)


@pytest.mark.distributed
@pytest.mark.slow
def test_hsdp_two_replicas_equal_one_rank(tmp_path, tunebench_home):
    # Two replicas of one shard each: batch 2 per rank = batch 4 on one process.
    mesh = "dp_replicate=2 x dp_shard=1 x cp=1 x tp=1"
    _same_run(tmp_path, tunebench_home, {}, {"data_parallel_replicate_dim": 2, "batch_size": 2}, mesh)


@pytest.mark.distributed
@pytest.mark.slow  # 2 torchrun launches; the checkpoint round trip under tp/cp is in the default suite
@pytest.mark.parametrize("degree", ["tensor_parallel_dim", "context_parallel_dim"])
def test_killed_under_tp_or_cp_and_resumed_equals_one_rank(tmp_path, tunebench_home, degree):
    # kill -9 of every rank after step 2 or later (possibly mid-save), then resume=true: the run
    # restarts from its last complete checkpoint and ends where one uninterrupted process does.
    import os
    import signal
    import subprocess

    from tests.engine.recipes.test_sft_process import _wait_for_step

    over = {"max_steps_per_epoch": 4, "save_every_n_steps": 1}
    if degree == "context_parallel_dim":
        over.update({"dataset.packed": True, "dataset.max_seq_len": 48, "batch_size": 2})
    one_cfg = _config(tmp_path, "one", **over)
    one = run_recipe(one_cfg)
    two_cfg = _config(tmp_path, "two", **over, **{degree: 2})
    path = write_config(two_cfg, tmp_path / "two.yaml")
    run_id = new_run(tunebench_home)
    env = recipe_env(tunebench_home, run_id)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "engine.recipes.sft", "--config", str(path)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        killed_at = _wait_for_step(tunebench_home, run_id, 2, proc, timeout=400)
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks: no handler runs
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert killed_at < 4
    done = _run(cmd + ["resume=true"], env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = losses(tunebench_home, run_id)
    assert [s for s, _ in rows] == [1, 2, 3, 4]  # each step once
    torch.testing.assert_close(
        torch.tensor([v for _, v in rows]), torch.tensor(one.loss_history), rtol=2e-5, atol=0
    )
    got, expected = _weights(two_cfg, 4), _weights(one_cfg, 4)
    assert set(got) == set(expected)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=2e-6, msg=key)


QLORA = {
    "model._component_": "engine.models.llama3.lora_llama3",
    "model.quantize_base": True,
    "model.lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"],
    "model.apply_lora_to_mlp": True,
    "model.lora_rank": 4,
}


@pytest.mark.distributed
@pytest.mark.slow
def test_qlora_under_tensor_parallel_equals_one_rank(tmp_path, tunebench_home):
    # The NF4 base stays whole on both ranks; adapters and the vocab-sharded output as under TP.
    mesh = "dp_replicate=1 x dp_shard=1 x cp=1 x tp=2; loss parallel (vocab-sharded logits)"
    one_cfg = _config(tmp_path, "one", **QLORA)
    one = run_recipe(one_cfg)
    two = _two_ranks(tmp_path, tunebench_home, _config(tmp_path, "two", **QLORA, tensor_parallel_dim=2), mesh)
    torch.testing.assert_close(torch.tensor(two), torch.tensor(one.loss_history), rtol=2e-5, atol=0)
    from pathlib import Path

    got = load_file(
        str(Path(tmp_path / "two" / "checkpoints" / f"step_{STEPS}" / "model" / "adapter_model.safetensors"))
    )
    expected = load_file(
        str(
            Path(one_cfg["output_dir"])
            / "checkpoints"
            / f"step_{STEPS}"
            / "model"
            / "adapter_model.safetensors"
        )
    )
    assert set(got) == set(expected) and got
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=2e-6, msg=key)


@pytest.mark.distributed
@pytest.mark.slow  # the engine-level equivalence (parallel_worker qlorafsdp) is in the default suite
def test_qlora_under_fsdp2_equals_one_rank(tmp_path, tunebench_home):
    # 128 wide: the MLP's NF4 bases are sharded over the 2 ranks, the attention's kept whole.
    wide = {**QLORA, "model.embed_dim": 128, "model.intermediate_dim": 256}
    mesh = "dp_replicate=1 x dp_shard=2 x cp=1 x tp=1"
    one_cfg = _config(tmp_path, "one", **wide)
    one = run_recipe(one_cfg)
    two_cfg = _config(tmp_path, "two", **wide, batch_size=2)
    two = _two_ranks(tmp_path, tunebench_home, two_cfg, mesh)
    torch.testing.assert_close(torch.tensor(two), torch.tensor(one.loss_history), rtol=2e-5, atol=0)
    from pathlib import Path

    def adapters(cfg):
        folder = Path(cfg["output_dir"]) / "checkpoints" / f"step_{STEPS}" / "model"
        return load_file(str(folder / "adapter_model.safetensors"))

    got, expected = adapters(two_cfg), adapters(one_cfg)
    assert set(got) == set(expected) and got
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=2e-6, msg=key)


def test_qlora_with_tensor_and_data_parallel_together_is_one_line_before_launch():
    from engine.recipes.sft import CONFIG_SCHEMA

    cfg = {"model": {"_component_": "engine.models.llama3.qlora_llama3_2_1b"}, "tensor_parallel_dim": 2}
    problems = CONFIG_SCHEMA.nproc_check(cfg, 4)
    assert [str(p) for p in problems] == [
        "tensor_parallel_dim: QLoRA (NF4 base) on 4 ranks runs under FSDP2 (tensor_parallel_dim=1) or pure "
        "tensor parallelism (tensor_parallel_dim=4), not tensor parallelism 2 x 2 data-parallel ranks — "
        "set tensor_parallel_dim=1 or 4, or use a lora_* builder"
    ]
    for tp in (1, 4):  # FSDP2 (the NF4 base sharded) or pure tensor parallelism (kept whole)
        assert CONFIG_SCHEMA.nproc_check({**cfg, "tensor_parallel_dim": tp}, 4) == []
    assert CONFIG_SCHEMA.nproc_check({"model": {**cfg["model"], "quantize_base": False}}, 4) == []
