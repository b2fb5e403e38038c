"""Sweeps: grid and list specs, `tunebench sweep` registering N queued runs with the right overrides and tag,
a bad value queueing nothing, and `tunebench compare --sweep` ranking the runs."""

from __future__ import annotations

import json

import pytest
import yaml

from engine.tracking import MetricLogger
from engine.tracking.db import open_db
from engine.tracking.paths import runs_root
from engine.tracking.readers import list_runs
from engine.tracking.run_rows import update_run
from workbench import run_queue
from workbench import sweeps as sweep
from workbench.cli import main
from workbench.errors import UserError


def test_values_split_at_top_level_commas_only():
    assert sweep.split_values("1e-4,3e-4") == ["1e-4", "3e-4"]
    assert sweep.split_values("[q_proj,v_proj],[q_proj,k_proj,v_proj]") == [
        "[q_proj,v_proj]",
        "[q_proj,k_proj,v_proj]",
    ]
    assert sweep.split_values("{a: 1, b: 2},'x,y', z") == ["{a: 1, b: 2}", "'x,y'", "z"]


def test_grid_list_and_line_specs():
    grid = sweep.combinations(["optimizer.lr=1e-4,3e-4", "x", "model.lora_rank=8,16"])
    assert grid == [
        ["optimizer.lr=1e-4", "model.lora_rank=8"],
        ["optimizer.lr=1e-4", "model.lora_rank=16"],
        ["optimizer.lr=3e-4", "model.lora_rank=8"],
        ["optimizer.lr=3e-4", "model.lora_rank=16"],
    ]
    assert sweep.combinations(["lr=1,2,3", "seed=7,8,9"], zip_values=True) == [
        ["lr=1", "seed=7"], ["lr=2", "seed=8"], ["lr=3", "seed=9"]
    ]  # fmt: skip
    assert sweep.parse_spec("optimizer.lr=1e-4,3e-4 x model.lora_rank=8,16") == grid
    assert sweep.parse_spec("lr=1 seed=7; lr=2 'notes=a b'") == [["lr=1", "seed=7"], ["lr=2", "notes=a b"]]
    for bad, line in (
        (["lr"], "sweep term 'lr': write KEY=VALUE1,VALUE2"),
        (["lr=1,,2"], "a value is empty"),
        (["lr=1", "lr=2"], "sweep key 'lr' is given twice"),
        (["x"], "the sweep has no terms"),
    ):
        with pytest.raises(UserError, match=line):
            sweep.combinations(bad)
    with pytest.raises(UserError, match=r"give every key as many values \(lr: 2, seed: 1\)"):
        sweep.combinations(["lr=1,2", "seed=7"], zip_values=True)
    with pytest.raises(UserError, match="at most 256"):
        sweep.combinations(["a=" + ",".join(map(str, range(20))), "b=" + ",".join(map(str, range(20)))])


@pytest.fixture
def lsq_cfg(tunebench_home, tmp_path):
    path = tmp_path / "lsq.yaml"
    path.write_text("# tunebench run lsq --config lsq.yaml\nsteps: 30\nlr: 0.05\nseed: 0\n")
    run_queue.pause()  # nothing launches: these tests look at what was registered and queued
    return path


def test_cli_sweep_registers_one_queued_run_per_combination(lsq_cfg, capsys):
    argv = ["sweep", "lsq", "--module", "lsq_recipe", "--config", str(lsq_cfg), "--name", "grid",
            "lr=0.01,0.1", "x", "seed=1,2,3", "--set", "steps=5", "--tag", "mine"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "sweep grid: 6 run(s) queued" in out and "tunebench compare --sweep grid" in out
    with open_db() as db:
        runs = sweep.sweep_runs("grid", db=db)
    assert [r.name for r in runs] == [f"grid-{i}" for i in range(1, 7)]
    assert [r.queue_pos for r in runs] == [1, 2, 3, 4, 5, 6]
    want = [(lr, seed) for lr in (0.01, 0.1) for seed in (1, 2, 3)]
    for run, (lr, seed) in zip(runs, want):
        assert run.status == "queued" and run.tag_list == ["mine", "sweep:grid"]
        assert run.notes == f"lr={lr} seed={seed}"
        cfg = yaml.safe_load(run.config_text)
        assert (cfg["lr"], cfg["seed"], cfg["steps"]) == (lr, seed, 5)  # every run's overrides, and --set
        assert yaml.safe_load((runs_root() / run.id / "config.yaml").read_text()) == cfg
        assert sweep.sweep_of(run) == "grid"

    assert (
        main(
            [
                "sweep",
                "lsq",
                "--module",
                "lsq_recipe",
                "--config",
                str(lsq_cfg),
                "--zip",
                "lr=0.2,0.3",
                "seed=4,5",
            ]
        )
        == 0
    )
    with open_db() as db:
        listed = sweep.sweep_runs("sweep-1", db=db)  # the default name
    assert [r.notes for r in listed] == ["lr=0.2 seed=4", "lr=0.3 seed=5"]
    assert [r.queue_pos for r in listed] == [7, 8]  # behind the first sweep

    assert main(argv) == 2  # the same name again: one line, nothing more registered
    assert capsys.readouterr().err.strip().endswith("sweep 'grid' exists already: choose another --name")


def test_a_bad_value_in_one_run_queues_nothing(tunebench_home, capsys):
    run_queue.pause()
    argv = [
        "sweep",
        "sft",
        "--config",
        "demo/smollm2_135m_lora",
        "optimizer.lr=1e-4,abc",
        "model.lora_rank=8,16",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "sweep sweep-1, run 3 (optimizer.lr=abc model.lora_rank=8)" in err[0]
    assert "optimizer.lr: torch.optim.AdamW expects float, got str 'abc'" in err[0]
    assert err[0].endswith("nothing was queued")
    with open_db() as db:
        assert list_runs(db=db) == []
    assert not runs_root().exists() or list(runs_root().iterdir()) == []
    assert main([*argv, "--dry-run"]) == 2  # --dry-run checks the same, one line
    assert "run 3 (optimizer.lr=abc model.lora_rank=8)" in capsys.readouterr().err

    dry = ["sweep", "sft", "--config", "demo/smollm2_135m_lora", "optimizer.lr=1e-4,3e-4", "--dry-run"]
    assert main(dry) == 0
    assert capsys.readouterr().out.splitlines() == [
        "1: optimizer.lr=1e-4", "2: optimizer.lr=3e-4", "2 run(s), all valid; nothing registered (--dry-run)"
    ]  # fmt: skip
    with open_db() as db:
        assert list_runs(db=db) == []

    # the same grid with good values: validated by the sft schema and queued
    assert (
        main(
            [
                "sweep",
                "sft",
                "--config",
                "demo/smollm2_135m_lora",
                "optimizer.lr=1e-4,3e-4",
                "model.lora_rank=8,16",
            ]
        )
        == 0
    )
    with open_db() as db:
        runs = sweep.sweep_runs("sweep-1", db=db)
    got = [
        (
            yaml.safe_load(r.config_text)["optimizer"]["lr"],
            yaml.safe_load(r.config_text)["model"]["lora_rank"],
        )
        for r in runs
    ]
    assert got == [(1e-4, 8), (1e-4, 16), (3e-4, 8), (3e-4, 16)]


def _finish(run, losses, val=None, evals=()):
    """Record a finished run's training losses, final validation loss and eval scores."""
    with MetricLogger(run_id=run.id, echo=False) as log:
        for step, loss in enumerate(losses, start=1):
            log.log(step, {"loss": loss})
        if val is not None:
            log.log(len(losses), {"val_loss": val[0]})
            log.log(len(losses) + 1, {"val_loss": val[1]})  # the final value counts, not the best
        for step, task, metric, value in evals:
            log.eval_result(step, task, metric, value)
    with open_db() as db:
        update_run(run.id, db=db, status="completed", queue_pos=None, started_at=1.0, ended_at=2.0)


def test_compare_ranks_a_sweep_by_final_val_loss_or_an_eval_score(lsq_cfg, capsys):
    assert (
        main(
            [
                "sweep",
                "lsq",
                "--module",
                "lsq_recipe",
                "--config",
                str(lsq_cfg),
                "--name",
                "lrs",
                "lr=0.01,0.02,0.03,0.04",
            ]
        )
        == 0
    )
    with open_db() as db:
        r1, r2, r3, r4 = sweep.sweep_runs("lrs", db=db)
    _finish(r1, [2.0, 1.0], val=(0.9, 0.50), evals=[(2, "gsm8k", "exact_match", 0.30)])
    _finish(
        r2,
        [2.0, 0.5],
        val=(0.1, 0.20),
        evals=[(1, "gsm8k", "exact_match", 0.90), (2, "gsm8k", "exact_match", 0.40)],
    )
    _finish(r3, [2.0, 0.7], val=(0.3, 0.35), evals=[(2, "gsm8k", "exact_match", 0.55)])
    # r4 never ran: no score, ranked last
    capsys.readouterr()

    assert main(["compare", "--sweep", "lrs", "--json"]) == 0
    ranking = json.loads(capsys.readouterr().out)["ranking"]
    assert (ranking["by"], ranking["higher_is_better"]) == ("val_loss", False)
    assert [(r["place"], r["name"], r["score"]) for r in ranking["rows"]] == [
        (1, "lrs-2", 0.20), (2, "lrs-3", 0.35), (3, "lrs-1", 0.50), (None, "lrs-4", None)
    ]  # fmt: skip

    assert main(["compare", "--sweep", "lrs", "--by", "eval:gsm8k/exact_match", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["ranking"]["rows"]
    # the latest score of each run (lrs-2's 0.90 was at step 1, 0.40 at step 2), higher is better
    assert [(r["name"], r["score"], r["step"]) for r in rows[:3]] == [
        ("lrs-3", 0.55, 2),
        ("lrs-2", 0.40, 2),
        ("lrs-1", 0.30, 2),
    ]

    assert main(["compare", "--sweep", "lrs", "--by", "loss"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "sweep lrs: 4 run(s) ranked by loss (lower is better, final value)"
    order = [line.split()[1] for line in text.splitlines()[2:6]]
    assert order == ["lrs-2", "lrs-3", "lrs-1", "lrs-4"]
    assert "lr=0.02" in text.splitlines()[2]
    assert "config differences:" in text

    for argv, line in (
        (["compare", "--sweep", "nope"], "no sweep named 'nope'"),
        (["compare", "--sweep", "lrs", "--by", "eval:gsm8k"], "--by eval:gsm8k: write eval:TASK/METRIC"),
        (["compare", "lrs-1", "lrs-2", "--by", "loss"], "--by ranks a sweep: give --sweep NAME too"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and line in err, err
