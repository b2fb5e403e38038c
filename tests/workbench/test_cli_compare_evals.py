"""`tunebench compare` shows each run's newest evaluation scores (text and --json)."""

import json

from engine.tracking import MetricLogger
from engine.tracking.db import open_db
from engine.tracking.run_rows import create_run
from workbench.cli import main


def test_compare_lists_newest_eval_scores_per_run(tunebench_home, capsys):
    with open_db() as db:
        a = create_run(db=db, recipe="sft", config_text="lr: 0.1\n", name="base")
        b = create_run(db=db, recipe="sft", config_text="lr: 0.2\n", name="tuned")
    with MetricLogger(run_id=a.id, echo=False) as log:
        log.log(1, {"loss": 2.0})
        log.eval_result(2, "arith_mc", "acc", 0.25)
        log.eval_result(4, "arith_mc", "acc", 0.5)  # newer: the one compare shows
    with MetricLogger(run_id=b.id, echo=False) as log:
        log.log(1, {"loss": 1.5})
        log.eval_result(3, "gsm8k_local", "exact_match", 0.125)

    assert main(["compare", "base", "tuned"]) == 0
    out = capsys.readouterr().out
    acc_line = next(line for line in out.splitlines() if line.startswith("eval arith_mc acc"))
    assert "0.5 @ step 4" in acc_line and "0.25" not in acc_line
    em_line = next(line for line in out.splitlines() if line.startswith("eval gsm8k_local exact_match"))
    assert "0.125 @ step 3" in em_line

    assert main(["compare", "base", "tuned", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["eval_results"][a.id] == [{"task": "arith_mc", "metric": "acc", "value": 0.5, "step": 4}]
    assert payload["eval_results"][b.id][0]["value"] == 0.125


def test_compare_shows_the_base_model_score_beside_the_run(tunebench_home, capsys):
    with open_db() as db:
        a = create_run(db=db, recipe="sft", config_text="lr: 0.1\n", name="demo-a")
        b = create_run(db=db, recipe="sft", config_text="lr: 0.2\n", name="demo-b")
    with MetricLogger(run_id=a.id, echo=False) as log:
        log.eval_result(0, "demo_em", "exact_match", 0.03, checkpoint="base")
        log.eval_result(40, "demo_em", "exact_match", 0.6)
    with MetricLogger(run_id=b.id, echo=False) as log:
        log.eval_result(40, "demo_em", "exact_match", 0.5)
    assert main(["compare", "demo-a", "demo-b"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("eval demo_em exact_match"))
    assert "0.6 @ step 40 (base 0.03)" in line and "0.5 @ step 40" in line
    assert main(["compare", "demo-a", "demo-b", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["eval_results"][a.id] == [
        {"task": "demo_em", "metric": "exact_match", "value": 0.6, "step": 40}
    ]
    assert payload["base_eval_results"] == {
        a.id: [{"task": "demo_em", "metric": "exact_match", "value": 0.03}],
        b.id: [],
    }
