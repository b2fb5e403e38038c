"""`tunebench show --json`: every per-rank metric comes in one shape, also on a one-process run."""

import json

from engine.tracking import MetricLogger
from engine.tracking.db import open_db
from engine.tracking.run_rows import create_run
from engine.training.meters import memory_stats
from workbench.cli import main


def _show(run_id, capsys):
    assert main(["show", run_id, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["metrics"]


def test_per_rank_metrics_have_one_shape(tunebench_home, capsys):
    import torch

    with open_db() as db:
        one = create_run(db=db, recipe="sft", config_text="lr: 0.1\n", name="one")
        two = create_run(db=db, recipe="sft", config_text="lr: 0.1\n", name="two")
    with MetricLogger(run_id=one.id, echo=False) as log:  # one process: rank 0 only
        for step in (1, 2):
            log.log(step, {"loss": 2.0 / step, **memory_stats(torch.device("cpu"))})
    with MetricLogger(run_id=two.id, echo=False) as log:  # two ranks, also a non-memory figure
        for step in (1, 2):
            log.log(step, {"loss": 1.0})
            for rank in (0, 1):
                log.log(step, {"rss_gb": 1.0 + rank, "tokens_seen": 10.0 * step}, rank=rank)

    m = _show(one.id, capsys)
    assert set(m) == {"loss", "mem_peak_gb", "mem_reserved_gb", "rss_gb"}
    assert m["loss"]["steps"] == [1, 2]  # a rank-0 scalar: a plain series
    for name in ("mem_peak_gb", "mem_reserved_gb", "rss_gb"):
        assert set(m[name]) == {"per_rank"} and m[name]["per_rank"]["0"]["steps"] == [1, 2], name
    m = _show(two.id, capsys)
    assert m["rss_gb"]["per_rank"]["1"]["values"] == [2.0, 2.0]
    assert set(m["tokens_seen"]["per_rank"]) == {"0", "1"}
    assert m["loss"] == {"steps": [1, 2], "values": [1.0, 1.0]}
