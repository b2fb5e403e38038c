"""Writer cost per optimizer step: 20 metrics logged per step through `MetricLogger`, against
simpler ways of writing the same rows, in one run on the same disk.

    .venv/bin/python bench/tracker_writer.py [--steps 2000] [--out bench/out/tracker_writer.json]

Per step it times what the training thread pays: `log(step, 20 metrics)` + `set_progress(step, total)`
(the previous step's rows are handed to the writer thread, which writes them in one BEGIN IMMEDIATE
transaction). `+ flush()` also waits for that transaction every step: the full cost of the SQLite
write, as if there were no writer thread. Peers: `naive sqlite` (one autocommitted INSERT per metric,
default pragmas: what a logger without batching does; fewer steps, it is slow) and `jsonl` (append one
JSON line per step and flush: the cost floor of any file logger).
Goal: median < 1 ms, i.e. < 1% of a 100 ms optimizer step.

`--contention`: 6 writer processes log 25 metrics per step as fast as they can into one database for
`--seconds` (the load of tests/engine/tracking/test_tracker_stress.py, without the kills); per writer
`MetricLogger.stats()` (longest lock hold, longest time rows waited queued without a commit,
back-pressure wait) and the time `close()` took, and the rows/s committed in all.

It also times the readers the workbench polls at 1-2 Hz, on a run of 50,000 steps x 20 metrics
(1M rows): the summary (last loss, median tokens/s, peak memory, ETA), an incremental poll by id and
by step, and a 500-point curve.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ itself, for machine_info
from machine_info import machine_line  # noqa: E402

from engine.tracking import MetricLogger  # noqa: E402
from engine.tracking.db import open_db  # noqa: E402
from engine.tracking.run_rows import create_run  # noqa: E402

NAMES = [f"metric_{i:02d}" for i in range(20)]


def _summary(samples_s: list[float]) -> dict:
    us = sorted(s * 1e6 for s in samples_s)
    q = lambda p: us[min(len(us) - 1, int(p * len(us)))]  # noqa: E731
    return {"median_us": statistics.median(us), "p90_us": q(0.90), "p99_us": q(0.99), "max_us": us[-1]}


def bench_metric_logger(home: Path, steps: int, *, echo: bool, flush_each_step: bool = False) -> dict:
    os.environ["TUNEBENCH_HOME"] = str(home)
    with open_db() as db:
        run = create_run(db=db, recipe="bench", config_text="")
    sink = io.StringIO()
    log = MetricLogger(run_id=run.id, echo=echo, stream=sink, max_delay_s=0)
    times = []
    for step in range(1, steps + 1):
        values = {n: step * 0.001 + i for i, n in enumerate(NAMES)}
        t0 = time.perf_counter()
        log.log(step, values)
        log.set_progress(step, steps)
        if flush_each_step:
            log.flush()
        times.append(time.perf_counter() - t0)
    log.close()
    with open_db() as db:
        n = db.execute("SELECT COUNT(*) FROM metrics WHERE run_id = ?", (run.id,)).fetchone()[0]
    assert n == steps * len(NAMES), n
    return _summary(times[10:])


def bench_naive_sqlite(path: Path, steps: int) -> dict:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE m (run_id TEXT, step INT, name TEXT, value REAL, time REAL, rank INT)")
    times = []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        now = time.time()
        for i, n in enumerate(NAMES):
            con.execute("INSERT INTO m VALUES (?, ?, ?, ?, ?, 0)", ("r", step, n, step * 0.001 + i, now))
        times.append(time.perf_counter() - t0)
    con.close()
    return _summary(times[10:])


def bench_jsonl(path: Path, steps: int) -> dict:
    times = []
    with open(path, "a") as f:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            f.write(json.dumps({"step": step, **{n: step * 0.001 + i for i, n in enumerate(NAMES)}}) + "\n")
            f.flush()
            times.append(time.perf_counter() - t0)
    return _summary(times[10:])


CONTENTION_WRITER = """
import json, sys, time
sys.path.insert(0, sys.argv[4])
from engine.tracking import MetricLogger
run_id, rank, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
names = [f"m{i:02d}" for i in range(25)]
log = MetricLogger(run_id=run_id, rank=rank, echo=False)
end, step = time.monotonic() + seconds, 0
while time.monotonic() < end:
    log.log(step, {n: step + i / 100 for i, n in enumerate(names)})
    step += 1
t0 = time.monotonic()
log.close()
print(json.dumps({"steps": step, "close_s": time.monotonic() - t0, **log.stats()}))
"""


def bench_contention(home: Path, writers: int = 6, seconds: float = 10.0) -> dict:
    import subprocess

    os.environ["TUNEBENCH_HOME"] = str(home)
    with open_db() as db:
        run = create_run(db=db, recipe="bench", config_text="")
    repo = str(Path(__file__).resolve().parent.parent)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONTENTION_WRITER, run.id, str(r), str(seconds), repo],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for r in range(writers)
    ]  # fmt: skip
    outs = [p.communicate() for p in procs]
    res = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    locked = sum("locked" in err for _, err in outs)
    with open_db() as db:
        rows = db.execute("SELECT COUNT(*) FROM metrics WHERE run_id = ?", (run.id,)).fetchone()[0]
    assert rows == sum(r["steps"] for r in res) * 25, "rows lost"
    return {
        "writers": writers,
        "seconds": seconds,
        "rows_per_s": rows / seconds,
        "longest_tx_s": max(r["longest_tx_s"] for r in res),
        "longest_gap_s": max(r["longest_gap_s"] for r in res),
        "close_s_max": max(r["close_s"] for r in res),
        "waited_s_median": statistics.median(r["waited_s"] for r in res),
        "database_is_locked": locked,
    }


def bench_readers(home: Path, steps: int = 50_000, repeats: int = 20) -> dict:
    from engine.tracking import readers
    from engine.tracking.db import write_tx
    from engine.tracking.run_rows import update_run

    os.environ["TUNEBENCH_HOME"] = str(home)
    names = ["loss", "lr", "grad_norm", "tokens_per_sec", "mem_peak_gb"] + NAMES[5:]
    with open_db() as db:
        run = create_run(db=db, recipe="bench", config_text="")
        t = time.time() - steps
        with write_tx(db):
            db.executemany(
                "INSERT INTO metrics (run_id, step, name, value, time, rank) VALUES (?, ?, ?, ?, ?, 0)",
                (
                    (run.id, s, n, s * 0.5 + i, t + s)
                    for s in range(1, steps + 1)
                    for i, n in enumerate(names)
                ),
            )
        update_run(run.id, db=db, status="running", started_at=t, step=steps, total_steps=2 * steps)
        rec = readers.get_run(run.id, db=db)
        last_id = db.execute("SELECT MAX(id) FROM metrics").fetchone()[0]
        cases = {
            "summary (runs table row)": lambda: readers.summarize(rec, db=db),
            "poll: metrics_since(after_id), 1 new step": lambda: readers.metrics_since(
                run.id, db=db, after_id=last_id - 20
            ),
            "poll: metrics_since(after_step), 10 new steps": lambda: readers.metrics_since(
                run.id, db=db, after_step=steps - 10
            ),
            "curve: metric_series(loss, max_points=500)": lambda: readers.metric_series(
                run.id, "loss", db=db, max_points=500
            ),
            "curve: metric_series(loss), all 50k points": lambda: readers.metric_series(
                run.id, "loss", db=db
            ),
        }
        out = {}
        for name, fn in cases.items():
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            out[name] = statistics.median(times) * 1e3
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--out", default="bench/out/tracker_writer.json")
    ap.add_argument("--contention", action="store_true", help="also the 6-writer unthrottled run")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of the contention run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        results = {
            "MetricLogger (tunebench)": bench_metric_logger(tmp / "a", args.steps, echo=False),
            "MetricLogger + step line": bench_metric_logger(tmp / "b", args.steps, echo=True),
            "MetricLogger + flush() every step": bench_metric_logger(
                tmp / "c", args.steps, echo=False, flush_each_step=True
            ),
            "naive sqlite (autocommit per metric)": bench_naive_sqlite(
                tmp / "naive.db", min(args.steps, 200)
            ),
            "jsonl append + flush": bench_jsonl(tmp / "m.jsonl", args.steps),
        }
        reads = bench_readers(tmp / "readers")
        contention = bench_contention(tmp / "contention", seconds=args.seconds) if args.contention else None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "steps": args.steps,
                "metrics_per_step": len(NAMES),
                "results": results,
                "readers_ms": reads,
                "contention": contention,
            },
            indent=2,
        )
    )
    print(machine_line())
    print(
        f"| writer ({len(NAMES)} metrics/step, {args.steps} steps) | median µs | p90 µs | p99 µs | max µs |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        print(
            f"| {name} | {r['median_us']:.0f} | {r['p90_us']:.0f} | {r['p99_us']:.0f} | {r['max_us']:.0f} |"
        )
    base = results["MetricLogger (tunebench)"]["median_us"]
    naive = results["naive sqlite (autocommit per metric)"]["median_us"]
    print(
        f"\nMetricLogger median {base:.0f} µs/step (goal < 1000); naive sqlite / MetricLogger = {naive / base:.1f}x"
    )
    print("\n| reader on 1M metric rows (50k steps x 20) | median ms |\n|---|---:|")
    for name, ms in reads.items():
        print(f"| {name} | {ms:.1f} |")
    if contention is not None:
        c = contention
        print(
            f"\ncontention: {c['writers']} writers x 25 metrics, unthrottled, {c['seconds']:g} s: "
            f"{c['rows_per_s']:.0f} rows/s committed, longest lock hold {c['longest_tx_s']:.3f} s, "
            f"longest wait without a commit {c['longest_gap_s']:.3f} s, slowest close() {c['close_s_max']:.2f} s, "
            f"median back-pressure wait {c['waited_s_median']:.1f} s, 'database is locked' {c['database_is_locked']}"
        )
    return 0 if base < 1000 else 1


if __name__ == "__main__":
    sys.exit(main())
