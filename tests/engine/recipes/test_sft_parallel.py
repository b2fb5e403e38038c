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


def _weights(cfg: dict) -> dict[str, torch.Tensor]:
    from pathlib import Path

    folder = Path(cfg["output_dir"]) / "checkpoints" / f"step_{STEPS}" / "model"
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


def test_qlora_on_a_data_parallel_mesh_is_one_line_before_launch():
    from engine.recipes.sft import CONFIG_SCHEMA

    cfg = {"model": {"_component_": "engine.models.llama3.qlora_llama3_2_1b"}, "tensor_parallel_dim": 1}
    problems = CONFIG_SCHEMA.nproc_check(cfg, 2)
    assert [str(p) for p in problems] == [
        "model.quantize_base: QLoRA (NF4 base) on 2 ranks runs under tensor parallelism only (the NF4 base "
        "replicated); FSDP2 shards plain weights — set tensor_parallel_dim=2, or use a lora_* builder"
    ]
    assert CONFIG_SCHEMA.nproc_check({**cfg, "tensor_parallel_dim": 2}, 2) == []
    assert CONFIG_SCHEMA.nproc_check({"model": {**cfg["model"], "quantize_base": False}}, 2) == []
