"""KTO (paired and unpaired), ORPO and SimPO through the DPO recipe on 2 gloo ranks (4 rows each) equal
one process with the 8 rows: per-step loss, rewards, accuracy, gradient norm, KTO's reference point `kl`
(z0), and the final weights. KTO's z0 couples the rows of a micro-batch (each prompt with another row's
completion): on several ranks it is the global micro-batch's, gathered and all-reduced; ORPO and SimPO
have no cross-row term. Also: each rank's share of the global mismatched rows, for rows of different
widths, is exactly the one-process rows. Self-contained (digit tokenizer, tiny Llama): no shared assets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.engine.recipes._sft_helpers import REPO

TINY = {
    "_component_": "engine.models.llama3.llama3",
    "vocab_size": 16, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 32,
    "intermediate_dim": 64, "max_seq_len": 32, "rope_base": 10000.0,
}  # fmt: skip
PAIRS = {"_component_": "engine.rl.toy_preferences.digit_preference_dataset", "n": 48, "distractors": 1}
UNPAIRED = {"_component_": "engine.rl.toy_preferences.digit_unpaired_dataset", "n": 48, "distractors": 1}
# name: (loss, dataset, SGD lr); KTO's lr moves the policy far enough for z0 to leave its clamp at 0
RUNS = {
    "kto": ({"_component_": "engine.modules.loss.KTOLoss", "beta": 0.5}, PAIRS, 2.0),
    "kto_unpaired": (
        {"_component_": "engine.modules.loss.KTOLoss", "beta": 0.5, "undesirable_weight": 1.25},
        UNPAIRED,
        2.0,
    ),
    "orpo": ({"_component_": "engine.modules.loss.ORPOLoss", "beta": 0.5}, PAIRS, 0.5),
    "simpo": ({"_component_": "engine.modules.loss.SimPOLoss", "beta": 2.0, "gamma": 0.5}, PAIRS, 0.5),
}
STEPS = 3
METRICS = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracy", "grad_norm")


def config(out, name: str, batch_size: int) -> dict:
    loss, data, lr = RUNS[name]
    return {
        "output_dir": str(out / name), "seed": 0, "device": "cpu", "dtype": "fp32", "checkpoint_dir": None,
        "model": dict(TINY), "tokenizer": {"_component_": "engine.rl.toy_task.DigitTokenizer"},
        "dataset": dict(data), "batch_size": batch_size, "gradient_accumulation_steps": 1, "epochs": 1,
        "max_steps_per_epoch": STEPS, "optimizer": {"_component_": "torch.optim.SGD", "lr": lr},
        "loss": dict(loss), "save_every_n_steps": None, "keep_last_n_checkpoints": 1,
    }  # fmt: skip


def ragged_rows(world: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """3 rows per rank of different prompt and response lengths, right-padded with 0 (labels shifted)."""
    g = torch.Generator().manual_seed(3)
    n, width = 3 * world, 12
    tokens = torch.zeros(n, width, dtype=torch.long)
    labels = torch.full((n, width), -100, dtype=torch.long)
    for i in range(n):
        p, r = 2 + i % 3, 1 + (i * 2) % 5  # prompt and response lengths
        row = torch.randint(1, 16, (p + r,), generator=g)
        tokens[i, : p + r] = row
        labels[i, p - 1 : p + r - 1] = row[p:]
    return tokens, labels


@pytest.fixture()
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the 1-thread ranks
    yield
    torch.set_num_threads(before)


@pytest.mark.distributed
def test_two_ranks_equal_one_rank(tmp_path, tunebench_home, one_thread):
    # ~40 s on 2 loaded cores: one torchrun launch runs the four configs in turn
    from engine.modules.loss.kto_loss import mismatched_pairs
    from engine.recipes.dpo import DPORecipe, check_config
    from tests.engine.recipes._recipe_runner import train_in_process

    one = {name: train_in_process(DPORecipe, check_config, config(tmp_path / "one", name, 8)).history
           for name in RUNS}  # fmt: skip
    configs = tmp_path / "two.json"
    configs.write_text(json.dumps([config(tmp_path / "two", name, 4) for name in RUNS]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "tests/engine/recipes/preference_ranks_worker.py", str(configs)]  # fmt: skip
    env = {
        **os.environ,
        "TUNEBENCH_HOME": str(tunebench_home),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }
    env.pop("TUNEBENCH_RUN_ID", None)
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("OK "))
    result = json.loads(line[3:])
    for name, two in zip(RUNS, result["histories"]):
        assert len(two) == len(one[name]) == STEPS, name
        keys = METRICS + (("kl",) if name.startswith("kto") else ())
        if name == "kto_unpaired":  # its accuracy compares the couples inside each rank's micro-batch
            keys = tuple(k for k in keys if k != "rewards/accuracy")
        for key in keys:
            got = torch.tensor([h[key] for h in two], dtype=torch.float64)
            want = torch.tensor([h[key] for h in one[name]], dtype=torch.float64)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=f"{name} {key}")
        if name.startswith("kto"):  # the reference point moved off its clamp: the all-reduce is tested
            assert max(h["kl"] for h in one[name]) > 1e-3, (name, [h["kl"] for h in one[name]])
        path = f"{name}/checkpoints/step_{STEPS}/model/model.safetensors"
        got, want = load_file(str(tmp_path / "two" / path)), load_file(str(tmp_path / "one" / path))
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=1e-6, msg=f"{name} {key}")

    # ragged rows: rank r's share is rows r, r+2, ... of the one-process mismatched rows
    tokens, labels = ragged_rows()
    want_t, want_l = mismatched_pairs(tokens, labels, 0)
    for rank, (kl_t, kl_l) in enumerate(result["kl_rows"]):
        w = len(kl_t[0])
        assert kl_t == want_t[rank::2, :w].tolist() and kl_l == want_l[rank::2, :w].tolist()
        assert (want_l[rank::2, w:] == -100).all()
