"""MetricLogger: buffering, flush points, NaN/inf round trip, stdout-only mode, eval results."""

import io
import math
import subprocess
import sys
import textwrap
import time

import torch

from engine.tracking import MetricLogger, readers
from engine.tracking.db import open_db
from engine.tracking.run_rows import create_run, truncate_after


def _run(db, **kw):
    return create_run(db=db, recipe="sft", config_text="lr: 0.1\n", **kw)


def _wait_rows(run_id, db, n, timeout=10.0):
    deadline = time.monotonic() + timeout
    rows = []
    while len(rows) < n and time.monotonic() < deadline:
        rows = readers.metrics_since(run_id, db=db)
        time.sleep(0.01)
    return rows


def test_nan_inf_round_trip(tunebench_home):
    with open_db() as db:
        run = _run(db)
    values = {"a": math.nan, "b": math.inf, "c": -math.inf, "d": 1.5, "e": torch.tensor(2.25), "f": 3}
    with MetricLogger(run_id=run.id, echo=False) as log:
        log.log(1, values)
        log.eval_result(1, "hellaswag", "acc", math.nan, checkpoint="step_1")
    with open_db() as db:
        got = {m.name: m.value for m in readers.metrics_since(run.id, db=db)}
        ev = readers.eval_results(run.id, db=db)
    assert math.isnan(got["a"]) and got["b"] == math.inf and got["c"] == -math.inf
    assert (got["d"], got["e"], got["f"]) == (1.5, 2.25, 3.0)
    assert (
        len(ev) == 1
        and ev[0].task == "hellaswag"
        and math.isnan(ev[0].value)
        and ev[0].checkpoint == "step_1"
    )


def test_flushes_when_the_next_step_starts(tunebench_home):
    with open_db() as db:
        run = _run(db)
        log = MetricLogger(run_id=run.id, echo=False, max_delay_s=0)  # no timer: only step/explicit flushes
        log.set_progress(1, 10)
        log.log(1, {"loss": 2.0, "lr": 0.1})
        assert readers.metrics_since(run.id, db=db) == []
        log.log(2, {"loss": 1.5})  # step 1 goes to the writer thread, step 2 stays buffered
        rows = _wait_rows(run.id, db, 2)
        time.sleep(0.3)
        assert readers.metrics_since(run.id, db=db, after_id=rows[-1].id) == []
        assert [(r.step, r.name) for r in rows] == [(1, "loss"), (1, "lr")]
        assert readers.get_run(run.id, db=db).step == 1
        assert readers.get_run(run.id, db=db).total_steps == 10
        log.close()
        rows2 = readers.metrics_since(run.id, db=db, after_id=rows[-1].id)
        assert [(r.step, r.name, r.value) for r in rows2] == [(2, "loss", 1.5)]


def test_timer_flushes_a_stale_buffer(tunebench_home):
    with open_db() as db:
        run = _run(db)
        log = MetricLogger(run_id=run.id, echo=False, max_delay_s=0.1)
        log.log(7, {"loss": 1.0})
        assert [r.step for r in _wait_rows(run.id, db, 1)] == [7]
        log.close()


def test_events_and_per_rank_rows(tunebench_home):
    with open_db() as db:
        run = _run(db)
    log0 = MetricLogger(run_id=run.id, rank=0, echo=False)
    log1 = MetricLogger(run_id=run.id, rank=1, echo=False)
    log0.log(3, {"loss": 1.0, "mem_peak_gb": 1.0})
    log1.log(3, {"mem_peak_gb": 2.5})
    log1.set_progress(99, 100)  # only rank 0 owns progress
    log0.event(3, "checkpoint", "saved checkpoints/step_3")
    log0.close()
    log1.close()
    with open_db() as db:
        s = readers.summarize(readers.get_run(run.id, db=db), db=db)
        ev = readers.events_since(run.id, db=db)
        per_rank = readers.metric_series(run.id, "mem_peak_gb", db=db, rank=None)
    assert s.mem_peak_gb == 2.5 and s.last_loss == 1.0 and s.run.step == 0
    assert [(e.kind, e.step) for e in ev] == [("checkpoint", 3)]
    assert sorted(v for _, v in per_rank) == [1.0, 2.5]


def test_stdout_only_without_run_id(tunebench_home):
    out = io.StringIO()
    log = MetricLogger(run_id=None, stream=out)
    log.set_progress(1, 4)
    log.log(1, {"loss": 2.5, "lr": 0.001})
    log.log(2, {"loss": 2.25})
    log.close()
    assert out.getvalue().splitlines() == ["step 1/4 | loss 2.5 | lr 0.001", "step 2/4 | loss 2.25"]
    assert not (tunebench_home / "tunebench.db").exists()


def test_from_env_flushes_at_exit_and_on_sigterm(tunebench_home, tmp_path):
    with open_db() as db:
        run = _run(db)
    for how in ("exit", "sigterm"):
        code = textwrap.dedent(f"""
            import os, signal
            from engine.tracking import MetricLogger
            log = MetricLogger.from_env(max_delay_s=0)
            log.log(1, {{"loss": 1.0}})
            log.log(2, {{"{how}": 2.0}})   # still buffered
            if "{how}" == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
        """)
        env = {"TUNEBENCH_HOME": str(tunebench_home), "TUNEBENCH_RUN_ID": run.id, "PATH": "/usr/bin:/bin"}
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        assert p.returncode == (0 if how == "exit" else -15), p.stderr
    with open_db() as db:
        names = [(r.step, r.name) for r in readers.metrics_since(run.id, db=db)]
    assert names == [(1, "loss"), (2, "exit"), (1, "loss"), (2, "sigterm")]


def test_truncate_after_is_atomic_and_complete(tunebench_home):
    with open_db() as db:
        run = _run(db)
        with MetricLogger(run_id=run.id, echo=False) as log:
            for s in range(1, 11):
                log.set_progress(s, 10)
                log.log(s, {"loss": 1.0 / s})
            log.event(8, "checkpoint", "step_8")
            log.eval_result(9, "t", "acc", 0.5)
        assert truncate_after(run.id, 6, db=db) == 4
        assert [s for s, _ in readers.metric_series(run.id, "loss", db=db)] == [1, 2, 3, 4, 5, 6]
        assert readers.events_since(run.id, db=db) == []
        assert readers.eval_results(run.id, db=db) == []
        assert readers.get_run(run.id, db=db).step == 6


def test_a_forked_child_never_touches_the_parents_connection(tunebench_home):
    import os

    with open_db() as db:
        run = _run(db)
    log = MetricLogger(run_id=run.id, echo=False)
    log.log(1, {"loss": 1.0})
    pid = os.fork()
    if pid == 0:  # a DataLoader-style worker: whatever it calls is a no-op
        try:
            log.log(2, {"child": 1.0})
            log.flush()
            log.close()
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    log.log(2, {"loss": 0.5})
    log.close()
    with open_db() as db:
        assert [(r.step, r.name) for r in readers.metrics_since(run.id, db=db)] == [(1, "loss"), (2, "loss")]
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_any_float_round_trips_exactly(tunebench_home):
    from hypothesis import example, given, settings
    from hypothesis import strategies as st

    with open_db() as db:
        run = _run(db)
    log = MetricLogger(run_id=run.id, echo=False, max_delay_s=0)
    state = {"step": 0, "last_id": 0}

    @settings(max_examples=60, deadline=None, database=None)
    @given(
        st.lists(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True), min_size=1, max_size=5)
    )
    @example([-0.0, 0.0, math.inf, -math.inf, math.nan, 5e-324, -5e-324])
    def check(values):
        state["step"] += 1
        log.log(state["step"], {f"v{i}": v for i, v in enumerate(values)})
        log.flush()
        with open_db() as db:
            rows = readers.metrics_since(run.id, db=db, after_id=state["last_id"])
        state["last_id"] = rows[-1].id
        for row, v in zip(rows, values):
            # SQLite writes an integral REAL as an integer on disk, so -0.0 reads back as 0.0 (equal under
            # IEEE comparison); every other value keeps its bits, sign included.
            assert (math.isnan(row.value) and math.isnan(v)) or (
                row.value == v and (v == 0 or math.copysign(1, row.value) == math.copysign(1, v))
            )

    check()
    log.close()
