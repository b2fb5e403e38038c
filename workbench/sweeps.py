"""Sweeps: a grid or a list of config overrides that becomes queued runs tagged with the sweep, and the
ranking of a sweep's runs by final validation loss or an evaluation score.

Spec (the CLI's arguments, or the Recipe screen's sweep line):
- grid: `optimizer.lr=1e-4,3e-4 x model.lora_rank=8,16` — each term `KEY=V1,V2,...`; every combination,
  the first key varying slowest (`x` between terms is optional). Values split at top-level commas only:
  `lora_attn_modules=[q_proj,v_proj],[q_proj,k_proj,v_proj]` is two values.
- list: `zip=True` pairs the values by position (every key gives as many); or, in one line, runs separated
  by `;`: `optimizer.lr=1e-4 model.lora_rank=8; optimizer.lr=3e-4 model.lora_rank=16`.

`create_sweep` checks every run's config (overrides applied, validated as a launch is) before it
registers anything: one bad value is one line naming the run and the key, and nothing is queued.
Runs are named `<sweep>-<i>`, tagged `sweep:<sweep>`, with their overrides as the note.
"""

from __future__ import annotations

import itertools
import os
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.tracking.records import RunRecord
from workbench.errors import UserError

TAG_PREFIX = "sweep:"
VAL_LOSS = "val_loss"
MAX_RUNS = 256  # a typo such as 1e-4,...,x100 should not register thousands of runs


def split_values(text: str) -> list[str]:
    """`a,[b,c],{d: 1, e: 2},'f,g'` -> `["a", "[b,c]", "{d: 1, e: 2}", "'f,g'"]`: commas inside brackets,
    braces or quotes do not split."""
    out, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur))
    return [v.strip() for v in out]


def _is_cross(term: str) -> bool:
    return term.strip().lower() in ("x", "×")


def axes(terms: Iterable[str]) -> list[tuple[str, list[str]]]:
    """`["lr=1,2", "x", "rank=8"]` -> `[("lr", ["1", "2"]), ("rank", ["8"])]`. Raises `UserError` on a
    term without `=`, an empty value, a key given twice, or an `x` that does not stand between two
    terms (first, last, or next to another `x`: a term is missing there), naming its position."""
    terms = [t for t in terms if t.strip()]
    only_crosses = all(_is_cross(t) for t in terms)  # no term at all: said below
    for pos, term in enumerate([] if only_crosses else terms, start=1):
        if _is_cross(term) and (pos in (1, len(terms)) or _is_cross(terms[pos]) or _is_cross(terms[pos - 2])):
            where = "first" if pos == 1 else "last" if pos == len(terms) else "next to another x"
            raise UserError(
                f"sweep term {pos} ({term!r}, {where}): `x` joins two terms, as in optimizer.lr=1e-4,3e-4 x "
                "model.lora_rank=8,16; add the missing term or remove the x"
            )
    out: list[tuple[str, list[str]]] = []
    for term in terms:
        if _is_cross(term):
            continue
        key, eq, values = term.partition("=")
        key = key.strip()
        if not eq or not key or key.startswith("~"):
            raise UserError(f"sweep term {term!r}: write KEY=VALUE1,VALUE2 (e.g. optimizer.lr=1e-4,3e-4)")
        vals = split_values(values)
        if any(v == "" for v in vals):
            raise UserError(f"sweep term {term!r}: a value is empty; separate values with single commas")
        if key in (k for k, _ in out):
            raise UserError(f"sweep key {key!r} is given twice: give all its values in one term")
        out.append((key, vals))
    if not out:
        raise UserError("the sweep has no terms: give KEY=VALUE1,VALUE2 ... (e.g. optimizer.lr=1e-4,3e-4)")
    return out


def combinations(terms: Iterable[str], *, zip_values: bool = False) -> list[list[str]]:
    """The override lists of a grid (every combination, the first key slowest) or, with `zip_values`, of
    a list (run i takes value i of every key; each key must give as many values)."""
    ax = axes(terms)
    if zip_values:
        counts = {len(v) for _, v in ax}
        if len(counts) > 1:
            sizes = ", ".join(f"{k}: {len(v)}" for k, v in ax)
            raise UserError(f"a list sweep pairs values by position: give every key as many values ({sizes})")
        runs = [[f"{k}={vals[i]}" for k, vals in ax] for i in range(counts.pop())]
    else:
        runs = [
            [f"{k}={v}" for (k, _), v in zip(ax, combo)] for combo in itertools.product(*(v for _, v in ax))
        ]
    if len(runs) > MAX_RUNS:
        raise UserError(f"the sweep makes {len(runs)} runs (at most {MAX_RUNS}): give fewer values")
    return runs


def parse_spec(text: str, *, zip_values: bool = False) -> list[list[str]]:
    """The Recipe screen's sweep line: a grid (`a=1,2 x b=3,4`), or runs separated by `;` (each run's
    `key=value` overrides, whitespace separated; quote a value with spaces)."""
    try:
        if ";" in text:
            runs = [shlex.split(part) for part in text.split(";") if part.strip()]
            for run in runs:
                for ov in run:
                    if "=" not in ov or ov.startswith("="):
                        raise UserError(f"sweep run {' '.join(run)!r}: {ov!r} is not KEY=VALUE")
            if not runs:
                raise UserError("the sweep has no runs: write KEY=VALUE ...; KEY=VALUE ...")
            return runs
        return combinations(shlex.split(text), zip_values=zip_values)
    except ValueError as exc:  # shlex: an unclosed quote
        raise UserError(f"sweep {text!r}: {exc}") from None


def _check_name(name: str) -> None:
    import re

    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,55}$", name):
        raise UserError(f"sweep name {name!r}: use letters, digits, '.', '_' or '-' (at most 56)")


def default_name() -> str:
    """`sweep-<n>`, the first n whose tag no run carries."""
    from engine.tracking.db import open_db
    from engine.tracking.paths import db_path

    if not db_path().exists():  # no runs yet: no sweep either (and no database made just to look)
        return "sweep-1"
    with open_db() as db:
        tags = {t for (tags,) in db.execute("SELECT tags FROM runs") for t in tags.split(",")}
    n = 1
    while f"{TAG_PREFIX}sweep-{n}" in tags:
        n += 1
    return f"sweep-{n}"


def create_sweep(
    recipe: str,
    runs: Sequence[Sequence[str]],
    *,
    config_path: str | os.PathLike | None = None,
    config_text: str | None = None,
    overrides: Iterable[str] = (),
    name: str | None = None,
    nproc: int = 1,
    module: str | None = None,
    tags: Iterable[str] = (),
    queue: bool = True,
) -> list[RunRecord]:
    """Register one run per entry of `runs` (its overrides after the common `overrides`), named
    `<name>-<i>`, tagged `sweep:<name>`, and put them all in the run queue (`queue`).

    Every run's config is checked first (`launcher.compose_config`); the first bad one raises a
    `UserError` naming the run and what is wrong, before anything is registered. Registration and
    queueing are all or none: a failure part way removes the runs already registered.
    """
    from engine.config import ConfigError
    from engine.tracking.db import open_db, require_writable
    from engine.tracking.paths import run_dir
    from engine.tracking.readers import get_run
    from engine.tracking.run_rows import delete_run
    from workbench import launcher, run_queue

    name = name or default_name()  # (reads the tracker; creates nothing)
    _check_name(name)
    if not runs:
        raise UserError("the sweep has no runs")
    base = list(overrides)
    # Every run's config first, before the tracker is written (or created) at all.
    for i, ovs in enumerate(runs, start=1):
        try:
            launcher.compose_config(
                recipe, config_path=config_path, config_text=config_text, overrides=[*base, *ovs],
                output_dir=run_dir(f"{name}-{i}"), module=module, nproc=nproc,
            )  # fmt: skip
        except (ConfigError, UserError) as exc:
            raise UserError(f"sweep {name}, run {i} ({' '.join(ovs)}): {exc}; nothing was queued") from None
    require_writable()  # a read-only tracker: its one line, before any run folder is made
    with open_db() as db:
        if db.execute(
            "SELECT 1 FROM runs WHERE ',' || tags || ',' LIKE ?", (f"%,{TAG_PREFIX}{name},%",)
        ).fetchone():
            raise UserError(f"sweep {name!r} exists already: choose another --name")
        for i in range(1, len(runs) + 1):
            try:
                get_run(f"{name}-{i}", db=db)
            except Exception:
                continue
            raise UserError(f"run name {name}-{i} is taken: choose another sweep --name")
    made: list[RunRecord] = []
    try:
        for i, ovs in enumerate(runs, start=1):
            made.append(
                launcher.create_run(
                    recipe,
                    config_path=config_path,
                    config_text=config_text,
                    overrides=[*base, *ovs],
                    nproc=nproc,
                    name=f"{name}-{i}",
                    module=module,
                    tags=[*tags, f"{TAG_PREFIX}{name}"],
                    notes=" ".join(ovs),
                )  # fmt: skip
            )
        if queue:
            return run_queue.queue_runs([r.id for r in made])
        return made
    except BaseException:
        import shutil

        with open_db() as db:
            for rec in made:
                if get_run(rec.id, db=db).supervisor_pid is None:  # never started: gone without a trace
                    delete_run(rec.id, db=db)
                    shutil.rmtree(rec.output_dir, ignore_errors=True)
        raise


def sweep_runs(name: str, *, db) -> list[RunRecord]:
    """The runs tagged `sweep:<name>`, in creation order."""
    from engine.tracking.readers import list_runs

    return sorted(
        (r for r in list_runs(db=db) if f"{TAG_PREFIX}{name}" in r.tag_list),
        key=lambda r: (r.created_at, r.name),
    )


def sweep_of(run: RunRecord | dict) -> str | None:
    """The sweep a run belongs to (its `sweep:` tag), or None."""
    tags = (
        run.tag_list
        if isinstance(run, RunRecord)
        else [t for t in str(run.get("tags") or "").split(",") if t]
    )
    return next((t[len(TAG_PREFIX) :] for t in tags if t.startswith(TAG_PREFIX)), None)


@dataclass(frozen=True)
class Ranked:
    """One run of a ranked sweep: its place (None: no score), the score and what it was."""

    place: int | None
    run: RunRecord
    score: float | None
    step: int | None


def _final_metric(run_id: str, metric: str, db) -> tuple[float, int] | None:
    import math

    row = db.execute(
        "SELECT value, step FROM metrics WHERE run_id = ? AND name = ? AND rank = 0 ORDER BY step DESC, id DESC LIMIT 1",
        (run_id, metric),
    ).fetchone()
    if row is None or row[0] is None or not math.isfinite(row[0]):
        return None
    return float(row[0]), int(row[1])


def _latest_eval(run_id: str, task: str, metric: str, db) -> tuple[float, int] | None:
    import math

    row = db.execute(
        "SELECT value, step FROM eval_results WHERE run_id = ? AND task = ? AND metric = ? ORDER BY step DESC, id DESC LIMIT 1",
        (run_id, task, metric),
    ).fetchone()
    if row is None or row[0] is None or not math.isfinite(row[0]):
        return None
    return float(row[0]), int(row[1])


def ranking_key(runs: Sequence[RunRecord], by: str | None, db) -> tuple[str, bool]:
    """What a sweep is ranked by and whether higher is better: `by` as given (`METRIC`, lower is
    better, or `eval:TASK/METRIC`, higher is better); by default the final `val_loss` when any run
    logged one, else the first evaluation score recorded, else the final training `loss`."""
    if by:
        if by.startswith("eval:"):
            task, _, metric = by[5:].partition("/")
            if not task or not metric:
                raise UserError(f"--by {by}: write eval:TASK/METRIC (as `tunebench show RUN` lists them)")
            return by, True
        return by, False
    ids = [r.id for r in runs]
    marks = ", ".join("?" for _ in ids)
    if (
        ids
        and db.execute(
            f"SELECT 1 FROM metrics WHERE name = ? AND run_id IN ({marks}) LIMIT 1", [VAL_LOSS, *ids]
        ).fetchone()
    ):
        return VAL_LOSS, False
    row = (
        ids
        and db.execute(
            f"SELECT task, metric FROM eval_results WHERE run_id IN ({marks}) ORDER BY id LIMIT 1", ids
        ).fetchone()
    )
    if row:
        return f"eval:{row[0]}/{row[1]}", True
    return "loss", False


def rank_sweep(name: str, *, by: str | None = None, db) -> tuple[str, bool, list[Ranked]]:
    """The sweep's runs, best first by `ranking_key`; runs without that score last (place None).
    Returns (what it is ranked by, higher is better, rows). Raises `UserError` for an unknown sweep."""
    runs = sweep_runs(name, db=db)
    if not runs:
        raise UserError(f"no sweep named {name!r}: `tunebench runs` shows the runs, tagged sweep:NAME")
    key, higher = ranking_key(runs, by, db)
    scored: list[tuple[RunRecord, tuple[float, int] | None]] = []
    for run in runs:
        if key.startswith("eval:"):
            task, _, metric = key[5:].partition("/")
            scored.append((run, _latest_eval(run.id, task, metric, db)))
        else:
            scored.append((run, _final_metric(run.id, key, db)))
    have = sorted((s for s in scored if s[1] is not None), key=lambda s: s[1][0], reverse=higher)  # type: ignore[index]
    rows = [Ranked(i, run, sc[0], sc[1]) for i, (run, sc) in enumerate(have, start=1)]  # type: ignore[misc]
    rows += [Ranked(None, run, None, None) for run, sc in scored if sc is None]
    return key, higher, rows


def ranking_rows(name: str, *, by: str | None = None) -> dict[str, Any]:
    """`rank_sweep` as plain data for the workbench: `{"by", "higher_is_better", "rows": [{place,
    id, name, status, score, step, notes}]}`."""
    from engine.tracking.db import open_db

    with open_db() as db:
        key, higher, rows = rank_sweep(name, by=by, db=db)
    return {
        "by": key,
        "higher_is_better": higher,
        "rows": [
            {
                "place": r.place,
                "id": r.run.id,
                "name": r.run.name,
                "status": r.run.status,
                "score": r.score,
                "step": r.step,
                "notes": r.run.notes,
            }  # fmt: skip
            for r in rows
        ],
    }


def sweep_from_text(
    recipe: str, spec: str, *, config_text: str, name: str | None = None, nproc: int = 1,
    module: str | None = None, tags: Iterable[str] = (),
) -> tuple[str, int]:  # fmt: skip
    """The Recipe screen's sweep line (`parse_spec`) over its composed YAML: every run checked, then
    registered and queued; returns the sweep's name and how many runs it queued."""
    made = create_sweep(
        recipe, parse_spec(spec), config_text=config_text, name=name, nproc=nproc, module=module, tags=tags
    )
    return str(sweep_of(made[0])), len(made)
