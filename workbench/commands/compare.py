"""`tunebench compare RUN RUN ... [--json]`: summary table side by side and the config keys that differ;
`--sweep NAME [--by KEY]` compares a sweep's runs, ranked first (`workbench.sweeps.rank_sweep`)."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="compare runs: summary table and config diff (--sweep: a ranked sweep)"
    )
    p.add_argument("runs", nargs="*", metavar="RUN", help="two or more run ids or names")
    p.add_argument("--json", action="store_true", help="one JSON object: summaries and config diff")
    p.add_argument("--sweep", metavar="NAME", help="the runs of a sweep (tunebench sweep), ranked best first")
    p.add_argument(
        "--by",
        metavar="KEY",
        help="rank a sweep by a metric's final value (lower is better; e.g. val_loss, loss) or by "
        "eval:TASK/METRIC (higher is better); default val_loss when logged, else the first eval score, else loss",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.config import parse_yaml
    from engine.tracking.db import open_db
    from engine.tracking.readers import eval_results, get_run, summarize
    from workbench.cli_format import config_diff, emit, json_safe, table
    from workbench.cli_progress import human_number
    from workbench.errors import UserError

    ranking = None
    if args.sweep:
        from workbench.sweeps import rank_sweep

        if args.runs:
            raise UserError("give runs or --sweep NAME, not both")
        with open_db(create=False) as db:
            ranking = rank_sweep(args.sweep, by=args.by, db=db)
        args.runs = [r.run.id for r in ranking[2]]
    elif args.by:
        raise UserError("--by ranks a sweep: give --sweep NAME too")
    elif len(args.runs) < 2:
        raise UserError("compare needs two or more runs: tunebench compare RUN RUN ... (or --sweep NAME)")
    with open_db(create=False) as db:
        summaries = [summarize(get_run(r, db=db), db=db) for r in args.runs]
        all_evals = [eval_results(s.run.id, db=db) for s in summaries]
    evals = [latest_scores(rows) for rows in all_evals]
    bases = [base_scores(rows) for rows in all_evals]
    configs = [parse_yaml(s.run.config_text, source=f"run {s.run.name}") for s in summaries]
    diff = config_diff(configs)
    if args.json:
        payload = {
            "runs": [s.to_dict() for s in summaries],
            "config_diff": diff,
            "eval_results": {
                s.run.id: [{"task": t, "metric": m, "value": v, "step": st} for (t, m), (v, st) in e.items()]
                for s, e in zip(summaries, evals)
            },
            "base_eval_results": {  # the run's base model (`tunebench eval RUN --base`)
                s.run.id: [{"task": t, "metric": m, "value": v} for (t, m), v in b.items()]
                for s, b in zip(summaries, bases)
            },
        }
        if ranking is not None:
            key, higher, rows = ranking
            payload["ranking"] = {
                "sweep": args.sweep, "by": key, "higher_is_better": higher,
                "rows": [{"place": r.place, "id": r.run.id, "name": r.run.name, "score": r.score,
                          "step": r.step, "overrides": r.run.notes} for r in rows],
            }  # fmt: skip
        emit(json.dumps(json_safe(payload), indent=2))
        return 0
    head = "" if ranking is None else _ranking_text(args.sweep, *ranking) + "\n\n"
    names = [s.run.name for s in summaries]
    f = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
    rows = [
        ["id", *[s.run.id for s in summaries]],
        ["recipe", *[s.run.recipe for s in summaries]],
        ["status", *[s.run.status for s in summaries]],
        ["step", *[f"{s.run.step}/{s.run.total_steps or '?'}" for s in summaries]],
        ["last loss", *[f(s.last_loss) for s in summaries]],
        ["tokens/s (median)", *[human_number(s.tokens_per_sec_median) for s in summaries]],
        ["peak memory GB", *[f(s.mem_peak_gb) for s in summaries]],
        ["parent", *[s.run.parent_id or "-" for s in summaries]],
    ]
    for task, metric in sorted({key for e in evals + bases for key in e}):
        cells = []
        for e, b in zip(evals, bases):
            value, step = e.get((task, metric), (None, None))
            cell = "-" if value is None else f"{value:.4g} @ step {step}"
            if (task, metric) in b:
                cell += f" (base {b[(task, metric)]:.4g})"
            cells.append(cell)
        rows.append([f"eval {task} {metric}", *cells])
    text = head + table(["", *names], rows) + "\n\n"
    if diff:
        text += "config differences:\n" + table(
            ["KEY", *names], [[k, *[_show(v) for v in vals]] for k, vals in diff.items()]
        )
    else:
        text += "configs are identical (output_dir aside)"
    emit(text)
    return 0


def _ranking_text(sweep: str, key: str, higher: bool, rows) -> str:
    from workbench.cli_format import table

    body = [
        [
            str(r.place or "-"),
            r.run.name,
            r.run.status,
            "-" if r.score is None else f"{r.score:.4g}",
            "-" if r.step is None else str(r.step),
            r.run.notes,
        ]  # fmt: skip
        for r in rows
    ]
    what = f"{key} ({'higher' if higher else 'lower'} is better{'' if key.startswith('eval:') else ', final value'})"
    return f"sweep {sweep}: {len(rows)} run(s) ranked by {what}\n" + table(
        [
            "RANK",
            "RUN",
            "STATUS",
            key.upper() if not key.startswith("eval:") else "SCORE",
            "STEP",
            "OVERRIDES",
        ],
        body,
    )


def latest_scores(rows) -> dict[tuple[str, str], tuple[float, int]]:
    """(task, metric) -> (value, step) of a run's newest evaluation of each score (its checkpoints'
    scores; the base model's are `base_scores`)."""
    from engine.tracking.records import BASE_CHECKPOINT

    latest: dict[tuple[str, str], tuple[float, int]] = {}
    for row in rows:  # ordered by step, then id: later rows win
        if row.checkpoint != BASE_CHECKPOINT:
            latest[(row.task, row.metric)] = (row.value, row.step)
    return latest


def base_scores(rows) -> dict[tuple[str, str], float]:
    """(task, metric) -> value of the run's base model (`tunebench eval RUN --base`; newest wins)."""
    from engine.tracking.records import BASE_CHECKPOINT

    return {(r.task, r.metric): r.value for r in rows if r.checkpoint == BASE_CHECKPOINT}


def _show(v) -> str:
    return "(absent)" if v is None else str(v)
