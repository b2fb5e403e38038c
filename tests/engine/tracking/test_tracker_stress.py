"""Stress: 4 writer processes (ranks of one run) logging 20 metrics at 100 Hz while a reader polls
incrementally (`id > last_id`): no row lost, none duplicated, no "database is locked".
The default suite runs 5 s; the full 30 s version is marked slow."""

import subprocess
import sys
import textwrap
import time

import pytest

from engine.tracking import open_db, readers
from engine.tracking.runs import create_run

WRITER = textwrap.dedent("""
    import sys, time
    from engine.tracking import MetricLogger
    run_id, rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    names = [f"m{i:02d}" for i in range(20)]
    log = MetricLogger(run_id=run_id, rank=rank, echo=False)
    t0 = time.perf_counter()
    for step in range(steps):
        log.log(step, {n: step + i / 100 for i, n in enumerate(names)})
        if rank == 0:
            log.set_progress(step, steps)
        delay = t0 + (step + 1) / 100 - time.perf_counter()   # 100 Hz
        if delay > 0:
            time.sleep(delay)
    log.close()
    print("done", steps)
""")


def _stress(tunebench_home, seconds: int) -> None:
    steps = seconds * 100
    with open_db() as db:
        run = create_run(db=db, recipe="stress", config_text="")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, run.id, str(rank), str(steps)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(4)
    ]
    seen: dict[int, tuple] = {}
    keys: set[tuple] = set()
    dup_keys = 0
    last_id = 0
    reader_errors = []
    with open_db() as db:
        while True:
            running = any(p.poll() is None for p in procs)
            try:
                rows = readers.metrics_since(run.id, db=db, after_id=last_id)
            except Exception as exc:  # counted, the test fails below
                reader_errors.append(repr(exc))
                rows = []
            for r in rows:
                assert r.id not in seen, f"row {r.id} returned twice"
                seen[r.id] = (r.rank, r.step, r.name)
                key = (r.rank, r.step, r.name)
                dup_keys += key in keys
                keys.add(key)
                last_id = r.id
            if not running and not rows:
                break
            time.sleep(0.05)
    outs = [p.communicate() for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "locked" not in err and out.strip() == f"done {steps}", err
    assert reader_errors == []
    expected = {(rank, s, f"m{i:02d}") for rank in range(4) for s in range(steps) for i in range(20)}
    assert dup_keys == 0
    assert keys == expected, f"missing {len(expected - keys)}, unexpected {len(keys - expected)}"
    with open_db() as db:
        assert db.execute("SELECT COUNT(*) FROM metrics WHERE run_id = ?", (run.id,)).fetchone()[0] == len(
            expected
        )
        assert readers.get_run(run.id, db=db).step == steps - 1


@pytest.mark.timeout(300)
def test_stress_short(tunebench_home):
    _stress(tunebench_home, seconds=5)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_stress_30s(tunebench_home):
    _stress(tunebench_home, seconds=30)
