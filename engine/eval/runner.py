"""Run lm-eval tasks on a model and flatten the scores into `(task, metric, value)` rows."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.eval.eval_errors import EvalError
from engine.eval.tasks import resolve_task_specs


@dataclass(frozen=True)
class Score:
    """One number of an evaluation: `task` (lm-eval's task name), `metric` (`acc`, `acc_norm`,
    `exact_match,strict-match`, ...; lm-eval's `metric,filter` with the filter `none` dropped),
    `value` (float), `stderr` (float | None)."""

    task: str
    metric: str
    value: float
    stderr: float | None = None


@dataclass
class EvalReport:
    """`scores` (list[Score]), `results` (lm-eval's full result dict), `samples` (per-task logged
    samples when asked for, else {}), `num_requests` (requests the model answered), `seconds`."""

    scores: list[Score]
    results: dict
    samples: dict = field(default_factory=dict)
    num_requests: int = 0
    seconds: float = 0.0


def flatten_scores(results: dict) -> list[Score]:
    """lm-eval's `results["results"]` -> `Score`s (aliases and stderr entries folded in; NaN kept)."""
    scores = []
    for task, metrics in results.get("results", {}).items():
        for key, value in metrics.items():
            if key in ("alias", "name", "sample_len", "sample_count") or "_stderr" in key:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            name, _, filt = key.partition(",")
            metric = name if filt in ("", "none") else f"{name},{filt}"
            err = metrics.get(f"{name}_stderr,{filt}" if filt else f"{name}_stderr")
            err = float(err) if isinstance(err, (int, float)) and not isinstance(err, bool) else None
            scores.append(Score(task, metric, float(value), err))
    return scores


def evaluate(
    lm,
    tasks: str | Sequence[str],
    *,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    apply_chat_template: bool = False,
    task_dirs: Sequence[str | os.PathLike] = (),
    gen_kwargs: dict | None = None,
    log_samples: bool = False,
    seed: int = 0,
) -> EvalReport:
    """Evaluate `lm` (a `TunebenchLM`, or any lm-eval model name's instance) on `tasks`.

    Args:
        tasks: names / YAML paths (see `engine.eval.tasks`). limit: first N documents per task
            (a float < 1: that fraction). num_fewshot: override the tasks' own. apply_chat_template:
            wrap prompts in the tokenizer's chat template. task_dirs: extra folders of task YAMLs.
        gen_kwargs: generation settings that override the tasks' (`{"max_gen_toks": 64}`).
        log_samples: keep per-document samples in `EvalReport.samples`. seed: lm-eval's seeds.
    Raises:
        EvalError: an unknown task, a bad limit.
    """
    import time

    import lm_eval

    if limit is not None and (
        limit <= 0 or (isinstance(limit, float) and limit >= 1 and not limit.is_integer())
    ):
        raise EvalError(f"limit: {limit} must be a positive count (or a fraction below 1)")
    if limit is not None and float(limit).is_integer():
        limit = int(limit)
    specs = resolve_task_specs(tasks, task_dirs)
    names = [s for s in specs if isinstance(s, str)]
    manager = task_manager(tuple(os.fspath(d) for d in task_dirs), include_defaults=bool(names))
    known = set(manager.all_tasks)
    for spec in names:
        if spec not in known:
            raise EvalError(
                f"tasks: unknown task {spec!r}; use a name from `lm_eval ls tasks`, a file in configs/eval/tasks, "
                "or a path to a task YAML"
            )
    calls = {"n": 0}
    counted = _count_requests(lm, calls)
    start = time.perf_counter()
    try:
        results = lm_eval.simple_evaluate(
            model=counted,
            tasks=specs,
            limit=limit,
            num_fewshot=num_fewshot,
            apply_chat_template=apply_chat_template,
            task_manager=manager,
            log_samples=log_samples,
            gen_kwargs=gen_kwargs,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
            bootstrap_iters=0,
        )
    finally:
        _uncount(counted)
    seconds = time.perf_counter() - start
    samples = results.pop("samples", {}) if results else {}
    return EvalReport(flatten_scores(results), results, samples, calls["n"], seconds)


@functools.lru_cache(maxsize=4)
def task_manager(task_dirs: tuple[str, ...] = (), *, include_defaults: bool = True):
    """An lm-eval `TaskManager` over `task_dirs` (+ lm-eval's own tasks when `include_defaults`), built
    once per process: indexing lm-eval's ~15k task files takes tens of seconds, so it is skipped
    when every task is a local file."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(task_dirs) or None, include_defaults=include_defaults)


_REQUEST_METHODS = ("loglikelihood", "loglikelihood_rolling", "generate_until")


def _count_requests(lm, calls: dict):
    """Wrap `lm`'s request methods so the number of requests it answers is counted (instance
    attributes; removed again by `_uncount`)."""
    for name in _REQUEST_METHODS:
        method = getattr(lm, name)

        def counted(requests, *args, _method=method, **kwargs):
            calls["n"] += len(requests)
            return _method(requests, *args, **kwargs)

        setattr(lm, name, counted)
    return lm


def _uncount(lm) -> None:
    for name in _REQUEST_METHODS:
        lm.__dict__.pop(name, None)


def is_finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
