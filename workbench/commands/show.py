"""`tunebench show RUN [--json] [--follow]`: config, status, summary, metric series, events, evals."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("show", help="one run: status, summary, metric series, events, eval results, config")
    p.add_argument("run", metavar="RUN", help="run id, name, or unique id prefix")
    p.add_argument("--json", action="store_true", help="everything as one JSON object (NaN/inf as strings)")
    p.add_argument("--follow", "-f", action="store_true", help="re-attach: show progress until the run ends")
    p.add_argument("--points", type=int, help="thin each metric series to at most N points (default: all)")
    p.set_defaults(func=run)


def collect(run_ref: str, *, points: int | None = None) -> dict:
    """Everything `show --json` prints for one run (series thinned to `points` when given)."""
    from engine.tracking.db import open_db
    from engine.tracking.readers import (
        eval_results,
        events_since,
        get_run,
        is_per_rank,
        metric_names,
        metric_ranks,
        metric_series,
        summarize,
    )

    with open_db(create=False) as db:
        rec = get_run(run_ref, db=db)
        summary = summarize(rec, db=db).to_dict()
        metrics = {}
        for name in metric_names(rec.id, db=db):
            ranks = metric_ranks(rec.id, name, db=db)
            if is_per_rank(name, ranks):  # one shape for every per-rank figure: a series per rank
                per_rank = {}
                for r in ranks:
                    pts = metric_series(rec.id, name, db=db, rank=r, max_points=points)
                    per_rank[str(r)] = {"steps": [s for s, _ in pts], "values": [v for _, v in pts]}
                metrics[name] = {"per_rank": per_rank}
            else:
                pts = metric_series(rec.id, name, db=db, rank=0, max_points=points)
                metrics[name] = {"steps": [s for s, _ in pts], "values": [v for _, v in pts]}
        return {
            "run": summary,
            "config": rec.config_text,
            "metrics": metrics,
            "events": [e.__dict__ for e in events_since(rec.id, db=db)],
            "eval_results": [e.__dict__ for e in eval_results(rec.id, db=db)],
        }


def run(args: argparse.Namespace) -> int:
    from workbench.cli_format import emit, json_safe, table
    from workbench.cli_progress import human_duration, human_number

    if args.follow:
        from engine.tracking.db import open_db
        from engine.tracking.readers import get_run
        from workbench.cli_progress import follow

        with open_db(create=False) as db:
            rec = get_run(args.run, db=db)
        return follow(rec.id, stream=sys.stderr)
    if args.points is not None and args.points < 2:
        from workbench.errors import UserError

        raise UserError(f"--points {args.points}: use 2 or more")
    data = collect(args.run, points=args.points)
    if args.json:
        emit(json.dumps(json_safe(data), indent=2))
        return 0
    r = data["run"]
    fmt_t = lambda t: "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))  # noqa: E731
    lines = [
        f"run {r['name']} ({r['id']})  recipe {r['recipe']}  status {r['status']}  kind {r['kind']}",
        f"  step {r['step']}/{r['total_steps'] or '?'}  last loss {_num(r['last_loss'])}  "
        f"tokens/s (median) {human_number(r['tokens_per_sec_median'])}  peak memory {_num(r['mem_peak_gb'])} GB  "
        f"ETA {human_duration(r['eta_s'])}",
        f"  created {fmt_t(r['created_at'])}  started {fmt_t(r['started_at'])}  ended {fmt_t(r['ended_at'])}  "
        f"exit code {r['exit_code'] if r['exit_code'] is not None else '-'}",
        f"  nproc {r['nproc']}  host {r['host']}  pid {r['pid'] or '-'}  output {r['output_dir']}",
    ]
    if r["parent_id"]:
        lines.append(f"  cloned from {r['parent_id']}")
    if r["tags"] or r["notes"]:
        lines.append(f"  tags {r['tags'] or '-'}  notes {r['notes'] or '-'}")
    if r["error"]:
        lines.append("  error:\n" + "\n".join("    " + ln for ln in r["error"].splitlines()))
    rows = []
    for name, m in data["metrics"].items():
        if "per_rank" in m:
            for rank, d in m["per_rank"].items():
                rows.append(_series_row(f"{name}[rank {rank}]", d["steps"], d["values"]))
        else:
            rows.append(_series_row(name, m["steps"], m["values"]))
    if rows:
        lines += ["", table(["METRIC", "POINTS", "FIRST", "LAST", "MIN", "MAX", "LAST STEP"], rows)]
    if data["eval_results"]:
        ev = [
            [str(e["step"]), e["task"], e["metric"], _num(e["value"]), e["checkpoint"] or "-"]
            for e in data["eval_results"]
        ]
        lines += ["", table(["STEP", "TASK", "METRIC", "VALUE", "CHECKPOINT"], ev)]
    if data["events"]:
        lines += ["", "events:"] + [
            f"  step {e['step']}: {e['kind']}: {e['text']}" for e in data["events"][-15:]
        ]
    lines += ["", "config:", data["config"].rstrip()]
    emit("\n".join(lines))
    return 0


def _num(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def _series_row(name: str, steps: list[int], values: list[float]) -> list[str]:
    finite = [v for v in values if math.isfinite(v)]
    return [
        name,
        str(len(values)),
        _num(values[0]),
        _num(values[-1]),
        _num(min(finite)) if finite else "-",
        _num(max(finite)) if finite else "-",
        str(steps[-1]),
    ]
