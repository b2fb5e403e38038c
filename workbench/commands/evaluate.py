"""`tunebench eval RUN_OR_MODEL --tasks T[,T...] [--limit N] [--batch-size B] [--step N | --all-checkpoints]`:
score a run's checkpoint or any model folder on lm-evaluation-harness tasks.

RUN_OR_MODEL is a run (id, name or unique prefix: its latest checkpoint, or `--step N`), a model
folder (Hugging Face files, or a LoRA checkpoint's PEFT adapters), a run's `checkpoints/step_<N>`
folder, or `demo`. Tasks: the offline files in configs/eval/tasks (`arith_mc`, `gsm8k_local`), a task
YAML path, or any lm-eval task name. A run's scores are stored with it at the checkpoint's step
(`tunebench show RUN`, `tunebench compare`); `--all-checkpoints` scores every saved step not yet
scored on these tasks (periodic evaluation of a training run, also while it trains). `--base`
scores the model the run started from (its config's `checkpoint_dir`) and stores those scores with
the run as its base (step 0, checkpoint `base`): Compare and `tunebench compare` show them beside
the run's own.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from workbench.cli_args import add_documented_command
from workbench.errors import UserError

_STEP = re.compile(r"^step_(\d+)$")


_HELP = "evaluate a run's checkpoint or a model folder with lm-evaluation-harness tasks"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_documented_command(subparsers, "eval", _HELP, __doc__)
    p.add_argument(
        "target", metavar="RUN_OR_MODEL", help="run id/name, model folder, checkpoint folder, or demo"
    )
    p.add_argument("--tasks", required=True, help="comma-separated tasks, e.g. arith_mc,gsm8k_local")
    p.add_argument("--limit", type=float, default=None, help="first N documents per task (default: all)")
    p.add_argument("--batch-size", type=int, default=8, help="requests per forward pass (default 8)")
    p.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: the task's)")
    p.add_argument("--max-gen-toks", type=int, default=None, help="cap on generated tokens per request")
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="context length in tokens (default: the model config's max_position_embeddings)",
    )
    p.add_argument("--chat", action="store_true", help="wrap prompts in the model's chat template")
    p.add_argument("--step", type=int, default=None, help="the run's checkpoint step (default: latest)")
    p.add_argument(
        "--all-checkpoints", action="store_true", help="score every checkpoint of the run not yet scored"
    )
    p.add_argument(
        "--base",
        action="store_true",
        help="score the run's base model (its checkpoint_dir) and store it with the run as its base",
    )
    p.add_argument("--task-dir", action="append", default=[], help="extra folder of task YAMLs (repeatable)")
    p.add_argument(
        "--dtype", choices=("fp32", "bf16"), default=None, help="default: fp32 on CPU, bf16 on GPU"
    )
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    p.add_argument("--json", action="store_true", help="print the scores as JSON")
    p.set_defaults(func=run)


def checkpoint_steps(output_dir: Path) -> dict[int, Path]:
    """`{step: model folder}` for the complete checkpoints under `output_dir/checkpoints/`: each
    `step_<N>/model/` (or `step_<N>/` itself) holding `config.json` or `adapter_config.json`."""
    found: dict[int, Path] = {}
    base = output_dir / "checkpoints"
    if not base.is_dir():
        return found
    for child in base.iterdir():
        match = _STEP.match(child.name)
        if not match:
            continue
        for folder in (child / "model", child):
            if (folder / "config.json").is_file() or (folder / "adapter_config.json").is_file():
                found[int(match.group(1))] = folder
                break
    return found


def _is_model_folder(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def resolve_target(spec: str, step: int | None) -> tuple[str | None, list[tuple[int, Path]], bool]:
    """`(run id or None, [(step, model folder)], NF4 base)` for RUN_OR_MODEL. Raises UserError saying
    what was looked for."""
    if spec == "demo":
        if step is not None:
            raise UserError("--step: only applies to a run; drop it for demo")
        return None, [(0, Path("demo"))], False
    path = Path(spec).expanduser()
    if path.is_dir():
        match = _STEP.match(path.name)
        if match:
            for folder in (path / "model", path):
                if _is_model_folder(folder):
                    return None, [(int(match.group(1)), folder)], False
        if _is_model_folder(path):
            if step is not None:
                raise UserError("--step: only applies to a run; a model folder is one checkpoint")
            return None, [(0, path)], False
        raise UserError(
            f"{path}: no config.json or adapter_config.json; point RUN_OR_MODEL at a model folder or a run"
        )
    if path.exists():
        raise UserError(f"{path}: is a file; RUN_OR_MODEL must be a model folder, a run id/name or demo")
    from engine.tracking.db import open_db
    from engine.tracking.paths import db_path
    from engine.tracking.readers import get_run
    from engine.tracking.tracker_errors import RunNotFound

    if not db_path().exists():
        raise UserError(
            f"RUN_OR_MODEL {spec!r}: not a folder, and there are no runs yet; give a model folder or demo"
        )
    try:
        with open_db(create=False) as db:
            rec = get_run(spec, db=db)
    except RunNotFound:
        raise UserError(
            f"RUN_OR_MODEL {spec!r}: no such folder or run; use a model folder, demo, or a run from `tunebench runs`"
        ) from None
    steps = checkpoint_steps(Path(rec.output_dir))
    if not steps:
        from engine.tracking.records import ACTIVE_STATUSES

        if rec.status in ACTIVE_STATUSES:
            raise UserError(
                f"run {rec.name}: no checkpoint under {rec.output_dir}/checkpoints yet; wait for one"
            )
        raise UserError(
            f"run {rec.name} ({rec.status}) saved no checkpoint under {rec.output_dir}/checkpoints; "
            "evaluate a model folder instead, or train again with checkpoints (tunebench clone)"
        )
    nf4 = trained_with_nf4_base(rec.config_text)
    if step is None:
        return rec.id, sorted(steps.items()), nf4
    if step not in steps:
        raise UserError(f"--step {step}: run {rec.name} has checkpoints at steps {sorted(steps)}; pick one")
    return rec.id, [(step, steps[step])], nf4


def trained_with_nf4_base(config_text: str) -> bool:
    """Whether a run's config trained LoRA adapters on an NF4 base (QLoRA): `model.quantize_base: true`
    or a `qlora_*` builder. Its adapters are then evaluated on the same NF4 base."""
    from engine.config import ConfigError
    from engine.config._yaml import parse_yaml

    try:
        cfg = parse_yaml(config_text or "")
    except ConfigError:
        return False
    model = cfg.get("model") if isinstance(cfg, dict) else None
    if not isinstance(model, dict):
        return False
    return bool(model.get("quantize_base")) or ".qlora_" in str(model.get("_component_", ""))


def base_model_of(config_text: str) -> str | None:
    """The model a run's config starts from: its `checkpoint_dir`, else `model.checkpoint_dir`
    (`lora_from_pretrained` configs), else None."""
    from engine.config import ConfigError
    from engine.config._yaml import parse_yaml

    try:
        cfg = parse_yaml(config_text or "")
    except ConfigError:
        return None
    if not isinstance(cfg, dict):
        return None
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    found = cfg.get("checkpoint_dir") or model.get("checkpoint_dir")
    return str(found) if found else None


def resolve_base(spec: str) -> tuple[str, Path]:
    """`(run id, base model folder or "demo")` for `--base`. Raises UserError when `spec` is not a
    run or its config names no base model."""
    from engine.tracking.db import open_db
    from engine.tracking.paths import db_path
    from engine.tracking.readers import get_run
    from engine.tracking.tracker_errors import RunNotFound

    if spec == "demo" or Path(spec).expanduser().exists() or not db_path().exists():
        raise UserError(
            f"--base: {spec!r} is not a run; --base scores a run's base model, give a run id or name"
        )
    try:
        with open_db(create=False) as db:
            rec = get_run(spec, db=db)
    except RunNotFound:
        raise UserError(f"--base: no run {spec!r}; use a run from `tunebench runs`") from None
    base = base_model_of(rec.config_text)
    if base is None:
        raise UserError(
            f"--base: run {rec.name}'s config has no checkpoint_dir; evaluate its base model folder directly"
        )
    return rec.id, Path(base)


def _scored_steps(run_id: str, tasks: list[str]) -> set[int]:
    from engine.tracking.db import open_db
    from engine.tracking.readers import eval_results

    with open_db(create=False) as db:
        rows = eval_results(run_id, db=db)
    from engine.tracking.records import BASE_CHECKPOINT

    by_step: dict[int, set[str]] = {}
    for row in rows:
        if row.checkpoint == BASE_CHECKPOINT:
            continue  # the base model's scores, not a checkpoint's
        by_step.setdefault(row.step, set()).add(row.task)
    return {s for s, names in by_step.items() if all(t in names for t in tasks)}


def _check(args: argparse.Namespace) -> None:
    if args.limit is not None and args.limit <= 0:
        raise UserError(f"--limit {args.limit:g}: must be positive")
    if args.batch_size < 1:
        raise UserError(f"--batch-size {args.batch_size}: must be at least 1")
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise UserError(f"--num-fewshot {args.num_fewshot}: must be 0 or more")
    if args.max_gen_toks is not None and args.max_gen_toks < 1:
        raise UserError(f"--max-gen-toks {args.max_gen_toks}: must be at least 1")
    if args.max_length is not None and args.max_length < 1:
        raise UserError(f"--max-length {args.max_length}: must be at least 1 (or leave it out)")
    if args.step is not None and args.all_checkpoints:
        raise UserError("--step and --all-checkpoints: choose one")
    if args.base and (args.step is not None or args.all_checkpoints):
        raise UserError("--base scores the run's base model: drop --step / --all-checkpoints")
    for folder in args.task_dir:
        if not Path(folder).expanduser().is_dir():
            raise UserError(f"--task-dir {folder}: no such folder; give a folder of lm-eval task YAMLs")


def run(args: argparse.Namespace) -> int:
    _check(args)
    from engine.eval.tasks import local_task_names, resolve_task_specs, split_tasks

    tasks = split_tasks(args.tasks)
    resolve_task_specs(tasks, args.task_dir)  # task files and their data exist, before any model loads
    if args.base:
        run_id, base = resolve_base(args.target)
        targets, nf4_base = [(0, base)], False
    else:
        run_id, targets, nf4_base = resolve_target(args.target, args.step)
    if run_id is not None:  # its scores go to the tracker: a read-only one is refused before a model loads
        from engine.tracking.db import require_writable

        require_writable()
    if run_id is not None and args.step is None and not args.all_checkpoints:
        targets = targets[-1:]  # the latest checkpoint
    if run_id is not None and args.all_checkpoints:
        local = local_task_names(args.task_dir)
        names = [Path(t).stem if t.endswith((".yaml", ".yml")) else t for t in tasks]
        done = _scored_steps(run_id, [n for n in names if n in local] or names)
        targets = [(s, f) for s, f in targets if s not in done]
        if not targets:
            print("every checkpoint is already scored on these tasks", file=sys.stderr)
            return 0
    from engine.recipes.eval import EvalRecipe
    from engine.tracking.records import BASE_CHECKPOINT

    limit = int(args.limit) if args.limit is not None and float(args.limit).is_integer() else args.limit
    jobs = []
    for step, folder in targets:
        cfg = {
            "model_dir": str(folder),
            "tasks": tasks,
            "limit": limit,
            "num_fewshot": args.num_fewshot,
            "batch_size": args.batch_size,
            "max_length": args.max_length,
            "gen_kwargs": {"max_gen_toks": args.max_gen_toks} if args.max_gen_toks else None,
            "apply_chat_template": args.chat,
            "task_dirs": list(args.task_dir),
            "dtype": args.dtype,
            "device": args.device,
            "quantize_base": nf4_base,
            "run": run_id,
            "step": step,
            "checkpoint_label": BASE_CHECKPOINT if args.base else None,
        }
        jobs.append((step, folder, EvalRecipe(cfg)))  # every config checked before anything is printed
    out = []
    for step, folder, recipe in jobs:
        what = f"the base model {folder}" if args.base else f"{folder} (step {step})"
        print(f"evaluating {what} on {', '.join(tasks)}", file=sys.stderr)
        report = recipe.run()
        out.append(
            {
                "step": step,
                "checkpoint": str(folder),
                "requests": report.num_requests,
                "seconds": round(report.seconds, 3),
                "scores": [{"task": s.task, "metric": s.metric, "value": s.value} for s in report.scores],
            }
        )
    if args.json:
        from workbench.cli_format import emit, json_safe

        emit(json.dumps(json_safe({"run": run_id, "results": out}), indent=2))
        return 0
    from workbench.cli_format import emit, table

    rows = [[str(r["step"]), s["task"], s["metric"], f"{s['value']:.4f}"] for r in out for s in r["scores"]]
    emit(table(["STEP", "TASK", "METRIC", "VALUE"], rows))
    if run_id is not None:
        kind = " as its base" if args.base else ""
        print(f"stored with run {run_id}{kind} (tunebench show {run_id})", file=sys.stderr)
    return 0
