"""`tunebench eval`: a run's checkpoints scored and shown by `tunebench show RUN --json`; a model
folder scored without a run; bad arguments as one line with exit code 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

from workbench.cli import main  # noqa: E402


@pytest.fixture(autouse=True)
def _offline_one_thread(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small ops on a loaded 2-core machine are far slower with two threads
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, llama3_tokenizer_or_stand_in) -> Path:
    """A tiny native Llama-3 (2 layers, 64 dims) written by `save_pretrained`, with the real
    Llama-3 tokenizer files (in a bare clone: SmolLM2's, from the demo model's GGUF)."""
    from engine.checkpoint import save_pretrained
    from engine.models.llama3 import llama3

    tok_dir = llama3_tokenizer_or_stand_in
    torch.manual_seed(0)
    model = llama3(
        num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, intermediate_dim=128, max_seq_len=512
    )
    out = tmp_path_factory.mktemp("cli_eval") / "model"
    save_pretrained(model, out)
    for f in tok_dir.iterdir():
        shutil.copy(f, out / f.name)
    return out


def _run_with_checkpoints(model_dir: Path, steps=(2, 4)):
    from engine.tracking.db import open_db
    from engine.tracking.run_rows import create_run

    with open_db() as db:
        rec = create_run(db=db, recipe="sft", config_text="seed: 0\n", name="sft-evaltest")
    for step in steps:
        shutil.copytree(model_dir, Path(rec.output_dir) / "checkpoints" / f"step_{step}" / "model")
    return rec


def test_eval_run_latest_then_all_checkpoints_shown_by_show_json(model_dir, tunebench_home, capsys):
    rec = _run_with_checkpoints(model_dir)
    assert main(["eval", "sft-evaltest", "--tasks", "arith_mc", "--limit", "4", "--batch-size", "4"]) == 0
    out = capsys.readouterr()
    assert "arith_mc" in out.out and "acc" in out.out and "step 4" in out.err
    assert main(["show", rec.id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["eval_results"]
    assert {(e["step"], e["task"], e["metric"]) for e in shown} == {
        (4, "arith_mc", "acc"),
        (4, "arith_mc", "acc_norm"),
    }
    assert all(e["checkpoint"].endswith("step_4/model") for e in shown)

    # --all-checkpoints scores only the steps not yet scored on these tasks (step 2 here).
    assert (
        main(["eval", rec.id[:6], "--tasks", "arith_mc", "--limit", "4", "--all-checkpoints", "--json"]) == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["run"] == rec.id and [r["step"] for r in result["results"]] == [2]
    assert main(["show", rec.id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["eval_results"]
    acc = {e["step"]: e["value"] for e in shown if e["metric"] == "acc"}
    assert set(acc) == {2, 4} and acc[2] == acc[4]  # same weights at both steps
    assert main(["eval", rec.id, "--tasks", "arith_mc", "--all-checkpoints"]) == 0
    assert "already scored" in capsys.readouterr().err


def test_eval_model_folder_json(model_dir, tunebench_home, capsys):
    assert main(["eval", str(model_dir), "--tasks", "arith_mc", "--limit", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["run"] is None and result["results"][0]["requests"] == 3 * 4
    metrics = {s["metric"] for s in result["results"][0]["scores"]}
    assert metrics == {"acc", "acc_norm"}


def test_max_length_reaches_the_recipe(model_dir, tunebench_home, capsys, monkeypatch):
    from engine.recipes.eval import EvalRecipe

    seen = []
    run = EvalRecipe.run

    def spy(self):
        seen.append(self.cfg["max_length"])
        return run(self)

    monkeypatch.setattr(EvalRecipe, "run", spy)
    assert (
        main(["eval", str(model_dir), "--tasks", "arith_mc", "--limit", "2", "--max-length", "64", "--json"])
        == 0
    )
    assert main(["eval", str(model_dir), "--tasks", "arith_mc", "--limit", "2", "--json"]) == 0
    assert seen == [64, None]  # None: the model config's max_position_embeddings


@pytest.mark.parametrize(
    "argv, message",
    [
        (["eval", "no-such-run", "--tasks", "arith_mc"], "no such folder or run"),
        (
            ["eval", "sft-evaltest", "--tasks", "arith_mc", "--step", "3"],
            "--step 3: run sft-evaltest has checkpoints at steps [2, 4]",
        ),
        (["eval", "sft-evaltest", "--tasks", "arith_mc", "--limit", "0"], "--limit 0: must be positive"),
        (
            ["eval", "sft-evaltest", "--tasks", "arith_mc", "--max-length", "0"],
            "--max-length 0: must be at least 1",
        ),
        (["eval", "sft-evaltest", "--tasks", " , "], "tasks: no task given"),
        (["eval", "sft-evaltest", "--tasks", "missing.yaml"], "missing.yaml does not exist"),
    ],
)
def test_bad_arguments_one_line_exit_2(argv, message, model_dir, tunebench_home, capsys):
    _run_with_checkpoints(model_dir)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_eval_real_sft_run_checkpoints_equal_hf_backend(
    model_dir, tunebench_home, shared_assets, capsys, monkeypatch
):
    """A real SFT run (full fine-tune of the tiny model, checkpoints at steps 2 and 4): `tunebench eval
    RUN --all-checkpoints` scores both; the step-4 scores equal lm-eval's hf backend on that folder."""
    import lm_eval

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "engine" / "recipes"))
    from _sft_helpers import run_recipe, tiny_config

    from engine.eval.runner import task_manager
    from engine.eval.tasks import resolve_task_specs
    from engine.tracking.db import open_db
    from engine.tracking.run_rows import create_run

    with open_db() as db:
        rec = create_run(db=db, recipe="sft", config_text="seed: 0\n", name="sft-real")
    model = {
        "_component_": "engine.models.llama3.llama3", "vocab_size": 128256, "num_layers": 2, "num_heads": 4,
        "num_kv_heads": 2, "embed_dim": 64, "intermediate_dim": 128, "max_seq_len": 512,
    }  # fmt: skip
    cfg = tiny_config(
        shared_assets, Path(rec.output_dir), model=model, max_steps_per_epoch=4, save_every_n_steps=2
    )
    cfg["checkpoint_dir"] = str(model_dir)
    cfg["tokenizer"]["path"] = str(model_dir)
    run_recipe(cfg)
    capsys.readouterr()
    assert (
        main(["eval", "sft-real", "--tasks", "arith_mc", "--limit", "8", "--all-checkpoints", "--json"]) == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in result["results"]] == [2, 4]
    step4 = result["results"][1]
    ref = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={step4['checkpoint']},dtype=float32",
        tasks=resolve_task_specs(["arith_mc"]),
        limit=8,
        batch_size=4,
        device="cpu",
        bootstrap_iters=0,
        task_manager=task_manager((), include_defaults=False),
    )
    ours = {s["metric"]: s["value"] for s in step4["scores"]}
    assert ours == {
        "acc": ref["results"]["arith_mc"]["acc,none"],
        "acc_norm": ref["results"]["arith_mc"]["acc_norm,none"],
    }
