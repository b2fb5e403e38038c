"""Readers: lookup by id/name/prefix, summaries (median tokens/s, peak memory, ETA), series, lineage."""

import statistics
import time

import pytest

from engine.tracking import MetricLogger, readers
from engine.tracking.db import open_db
from engine.tracking.run_rows import create_run, update_run
from engine.tracking.tracker_errors import RunNotFound, TrackerError


def test_lookup_by_id_name_prefix(tunebench_home):
    with open_db() as db:
        a = create_run(db=db, recipe="sft", config_text="", name="alpha")
        b = create_run(db=db, recipe="sft", config_text="")
        assert b.name == "sft-2"
        assert readers.get_run(a.id, db=db).name == "alpha"
        assert readers.get_run("alpha", db=db).id == a.id
        assert readers.get_run("sft-2", db=db).id == b.id
        update_run(a.id, db=db, status="running")
        assert sorted(r.id for r in readers.active_runs(db=db)) == sorted([a.id, b.id])
        with pytest.raises(RunNotFound, match="'nope'.*tunebench runs"):
            readers.get_run("nope", db=db)
        with pytest.raises(TrackerError, match="taken"):
            create_run(db=db, recipe="sft", config_text="", name="alpha")
        with pytest.raises(TrackerError, match="letters, digits"):
            create_run(db=db, recipe="sft", config_text="", name="bad name")
        with pytest.raises(TrackerError, match="status"):
            update_run(a.id, db=db, status="exploded")


def test_summary_against_plain_python(tunebench_home):
    tps = [100.0, 300.0, 200.0, 50.0, 400.0, 250.0]
    with open_db() as db:
        run = create_run(db=db, recipe="sft", config_text="")
        update_run(run.id, db=db, status="running", started_at=time.time() - 10)
        with MetricLogger(run_id=run.id, echo=False) as log:
            for s, t in enumerate(tps, start=1):
                log.set_progress(s, 12)
                log.log(s, {"loss": 10.0 / s, "tokens_per_sec": t, "mem_peak_gb": s * 0.5})
        s = readers.summarize(readers.get_run(run.id, db=db), db=db)
    assert s.tokens_per_sec_median == statistics.median(tps)
    assert s.last_loss == 10.0 / 6
    assert s.mem_peak_gb == 3.0
    assert s.run.step == 6 and s.run.total_steps == 12
    assert s.eta_s is not None and 0 <= s.eta_s < 5  # six more steps at the (fast) observed rate
    assert "config_text" not in s.to_dict() and s.to_dict()["last_loss"] == 10.0 / 6


def test_series_downsampling_keeps_ends_and_incremental_after_step(tunebench_home):
    with open_db() as db:
        run = create_run(db=db, recipe="sft", config_text="")
        with MetricLogger(run_id=run.id, echo=False) as log:
            for s in range(1, 101):
                log.log(s, {"loss": float(s), "lr": 0.1})
        pts = readers.metric_series(run.id, "loss", db=db, max_points=10)
        assert len(pts) == 10 and pts[0] == (1, 1.0) and pts[-1] == (100, 100.0)
        newer = readers.metrics_since(run.id, db=db, after_step=98, names=["loss"])
        assert [(m.step, m.name) for m in newer] == [(99, "loss"), (100, "loss")]
        assert readers.metric_names(run.id, db=db) == ["loss", "lr"]


def test_lineage_and_children(tunebench_home):
    with open_db() as db:
        a = create_run(db=db, recipe="sft", config_text="")
        b = create_run(db=db, recipe="sft", config_text="", parent_id=a.id, kind="clone")
        c = create_run(db=db, recipe="sft", config_text="", parent_id=b.id, kind="clone")
        assert [r.id for r in readers.lineage(c.id, db=db)] == [a.id, b.id, c.id]
        assert [r.id for r in readers.children(a.id, db=db)] == [b.id]
        assert readers.config_text(a.id, db=db) == ""
