"""Evaluation recipe: score one model folder on lm-eval tasks and store the scores in the tracker.

    python -m engine.recipes.eval --config configs/eval/arith_mc.yaml model_dir=runs/<id>/checkpoints/step_40/model
    tunebench eval RUN_OR_MODEL --tasks arith_mc,gsm8k_local --limit 50       (builds this config)

The model is `model_dir`: a Hugging Face folder, a PEFT adapter folder (a LoRA run's
`checkpoints/step_<N>/model/`, loaded onto the base its `adapter_config.json` names) or `demo`.
Scores go to the tracker run `run` (else `TUNEBENCH_RUN_ID`; none: printed only) as
`eval_results` rows at `step` with the checkpoint folder, plus an `eval` event; with `output_dir`
the full lm-eval result is also written to `output_dir/eval/step_<N>.json` (temp file + rename).

Periodic evaluation: the SFT recipe saves `checkpoints/step_<N>/` every `save_every_n_steps`;
`tunebench eval RUN --all-checkpoints` scores each of them (steps already scored for the same
tasks are skipped), during or after training, so every step's scores sit beside its loss.

Exit codes: 0 done, 2 bad config, model or task (one line on stderr).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from engine.config import ConfigError, KeyRule, find_config, load_config
from engine.recipes._common import TRAINING_KEY_RULES, check_output_dir, parse_recipe_args

CONFIG_KEYS: dict[str, str] = {
    "model_dir": "model to score: HF folder, PEFT adapter folder (LoRA checkpoint) or 'demo'",
    "tasks": "lm-eval tasks: names, files in configs/eval/tasks (arith_mc, gsm8k_local) or task YAML paths",
    "limit": "first N documents per task (null: all); a fraction below 1 takes that share",
    "num_fewshot": "few-shot examples per prompt (null: each task's own)",
    "batch_size": "requests per forward pass (larger is faster until memory runs out)",
    "max_length": "context length (null: the model config's max_position_embeddings)",
    "max_gen_toks": "new-token budget for generation tasks that set none",
    "gen_kwargs": "generation settings overriding the tasks' ({max_gen_toks: 64, temperature: 0})",
    "apply_chat_template": "wrap prompts in the tokenizer's chat template (instruct models)",
    "task_dirs": "extra folders of lm-eval task YAMLs",
    "dtype": "fp32 or bf16 (null: fp32 on CPU, bf16 on CUDA)",
    "device": "cpu, cuda or auto",
    "quantize_base": "LoRA adapters only: keep the base in NF4 as QLoRA trained it",
    "seed": "seed for lm-eval's few-shot sampling and any sampled generation",
    "run": "tracker run (id, name or prefix) the scores belong to (null: TUNEBENCH_RUN_ID, else none)",
    "step": "training step of the checkpoint, stored with the scores (null: 0)",
    "output_dir": "folder for eval/step_<N>.json with lm-eval's full results (null: not written)",
    "resume": "accepted for the launcher's resume; evaluation simply runs again",
    "allowed_components": "extra module prefixes allowed in _component_ (see the Config section)",
}

# What each key accepts (engine.config.validate checks it before anything loads); null means the default.
CONFIG_TYPES: dict[str, KeyRule] = {
    "model_dir": KeyRule(str | None),
    "tasks": KeyRule(list[str] | str | None),
    "limit": KeyRule(float | None, above=0.0),
    "num_fewshot": KeyRule(int | None, minimum=0),
    "batch_size": KeyRule(int | None, minimum=1),
    "max_length": KeyRule(int | None, minimum=1),
    "max_gen_toks": KeyRule(int | None, minimum=1),
    "gen_kwargs": KeyRule(dict | None),
    "apply_chat_template": KeyRule(bool | None),
    "task_dirs": KeyRule(list[str] | None),
    "dtype": KeyRule(str | None, pattern=TRAINING_KEY_RULES["dtype"].pattern, expect="fp32, bf16 or null"),
    "device": KeyRule(
        str | None, pattern=TRAINING_KEY_RULES["device"].pattern, expect="cpu, cuda, cuda:N or auto"
    ),
    "quantize_base": KeyRule(bool | None),
    "seed": KeyRule(int | None),
    "run": KeyRule(str | int | None),
    "step": KeyRule(int | None, minimum=0),
    "output_dir": KeyRule(str | None),
    "resume": KeyRule(bool | str | None),
}

MAX_NPROC = 1  # one process (the launcher refuses more before registering a run)

DEFAULTS = {
    "limit": None,
    "num_fewshot": None,
    "batch_size": 8,
    "max_length": None,
    "max_gen_toks": 256,
    "gen_kwargs": None,
    "apply_chat_template": False,
    "task_dirs": [],
    "dtype": None,
    "device": "auto",
    "quantize_base": False,
    "seed": 0,
    "run": None,
    "step": None,
    "output_dir": None,
}


def check_config(cfg: dict) -> dict:
    """`cfg` with defaults filled in. Raises ConfigError for unknown keys (did-you-mean from
    `engine.config.validate`), a missing `model_dir`/`tasks`, or values of the wrong kind."""
    from engine.config import validate

    problems = validate(cfg, recipe="eval")
    if problems:
        raise ConfigError(str(problems[0]), field=problems[0].field)
    out = {**DEFAULTS, **{k: v for k, v in cfg.items() if v is not None or k not in DEFAULTS}}
    for key in ("model_dir", "tasks"):
        if not out.get(key):
            raise ConfigError(f"{key}: missing — set {key}=... (see configs/eval/arith_mc.yaml)", field=key)
    for key in ("batch_size", "max_gen_toks"):
        if not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < 1:
            raise ConfigError(f"{key}: {out[key]!r} must be a positive integer", field=key)
    for key in ("num_fewshot", "step", "max_length"):
        if out[key] is not None and (
            not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < 0
        ):
            raise ConfigError(f"{key}: {out[key]!r} must be a whole number >= 0 or null", field=key)
    limit = out["limit"]
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0):
        raise ConfigError(f"limit: {limit!r} must be a positive number or null", field="limit")
    for folder in out["task_dirs"] or ():
        if not Path(folder).expanduser().is_dir():
            raise ConfigError(
                f"task_dirs: {folder} is not a folder — give folders of lm-eval task YAMLs", field="task_dirs"
            )
    if out["gen_kwargs"] is not None and not isinstance(out["gen_kwargs"], dict):
        raise ConfigError("gen_kwargs: must be a mapping such as {max_gen_toks: 64}", field="gen_kwargs")
    if out["dtype"] is not None and str(out["dtype"]).lower() not in ("fp32", "float32", "bf16", "bfloat16"):
        raise ConfigError(f"dtype: unknown dtype {out['dtype']!r} — use fp32 or bf16", field="dtype")
    return out


class EvalRecipe:
    """Loads the model, runs the tasks, records the scores. `run()` returns the `EvalReport`."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = check_config(cfg)

    def _model_dir(self) -> Path:
        spec = str(self.cfg["model_dir"])
        if spec == "demo":
            from engine.models.demo import demo_model_dir

            return Path(demo_model_dir())
        folder = Path(spec).expanduser()
        if not folder.is_dir():
            raise ConfigError(
                f"model_dir: {folder} is not a model folder (no such folder) — point it at a Hugging Face model folder, a run's "
                "checkpoints/step_<N>/model, or demo",
                field="model_dir",
            )
        return folder

    def _run_id(self) -> str | None:
        ref = self.cfg["run"] or os.environ.get("TUNEBENCH_RUN_ID") or None
        if ref is None:
            return None
        from engine.tracking.db import open_db
        from engine.tracking.errors import TrackerError
        from engine.tracking.readers import get_run

        try:
            with open_db(create=False) as db:
                return get_run(str(ref), db=db).id
        except TrackerError as exc:  # no such run, or no tracker database at all
            raise ConfigError(
                f"run: {ref!r} is not a tracker run ({exc}) — set run to one from `tunebench runs`, or null",
                field="run",
            ) from None

    def run(self):
        from engine.eval import TunebenchLM, evaluate
        from engine.tracking import MetricLogger

        cfg = self.cfg
        if cfg["output_dir"]:
            check_output_dir(cfg["output_dir"])  # before the (long) evaluation, not after it
        run_id = self._run_id()  # likewise: an unknown run is named before anything is scored
        folder = self._model_dir()
        dtype = cfg["dtype"]
        dtype = {"fp32": "float32", "bf16": "bfloat16"}.get(str(dtype).lower(), dtype) if dtype else None
        lm = TunebenchLM(
            pretrained=folder,
            batch_size=cfg["batch_size"],
            max_length=cfg["max_length"],
            max_gen_toks=cfg["max_gen_toks"],
            dtype=dtype,
            device=cfg["device"],
            quantize_base=cfg["quantize_base"],
        )
        report = evaluate(
            lm,
            cfg["tasks"],
            limit=cfg["limit"],
            num_fewshot=cfg["num_fewshot"],
            apply_chat_template=bool(cfg["apply_chat_template"]),
            task_dirs=cfg["task_dirs"] or (),
            gen_kwargs=cfg["gen_kwargs"],
            seed=int(cfg["seed"]),
        )
        step = int(cfg["step"] or 0)
        logger = MetricLogger(run_id=run_id, echo=False)
        try:
            for score in report.scores:
                logger.eval_result(step, score.task, score.metric, score.value, checkpoint=str(folder))
            summary = ", ".join(f"{s.task} {s.metric} {s.value:.4g}" for s in report.scores)
            logger.event(step, "eval", f"{folder}: {summary}")
        finally:
            logger.close()
        if cfg["output_dir"]:
            write_results(Path(cfg["output_dir"]) / "eval" / f"step_{step}.json", report.results)
        return report


def write_results(path: Path, results: dict) -> Path:
    """lm-eval's result dict as JSON at `path` (temp file + `os.replace`; never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(results, fh, indent=2, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def recipe_main(argv: list[str] | None = None) -> int:
    """Entry point: `--config FILE [overrides]`; prints one `task metric value` line per score."""
    config_path, overrides = parse_recipe_args(argv, prog="python -m engine.recipes.eval")
    try:
        report = EvalRecipe(load_config(find_config(config_path), overrides)).run()
    except ConfigError as exc:
        print(f"eval: {exc}", file=sys.stderr)
        return 2
    for s in report.scores:
        print(f"{s.task}\t{s.metric}\t{s.value:.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(recipe_main())
