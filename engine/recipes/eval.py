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

from engine.config import ConfigError, ConfigProblem, find_config, load_config
from engine.config.recipe_schema import Field, Schema
from engine.recipes._entry import check_output_dir, parse_recipe_args
from engine.recipes._fields import SHARED
from engine.tracking.records import BASE_CHECKPOINT


def _model_and_tasks_given(cfg: dict) -> list[ConfigProblem]:
    return [
        ConfigProblem(key, "missing", f"set {key}=... (see configs/eval/arith_mc.yaml)")
        for key in ("model_dir", "tasks")
        if not cfg.get(key)
    ]


_DTYPE, _DEVICE = SHARED["dtype"], SHARED["device"]

# Every key this recipe reads (null means the default); engine.config.validate checks it before anything loads.
CONFIG_SCHEMA = Schema(
    {
        "model_dir": Field(
            str | None, None, "model to score: HF folder, PEFT adapter folder (LoRA checkpoint) or 'demo'"
        ),
        "tasks": Field(
            list[str] | str | None,
            None,
            "lm-eval tasks: names, files in configs/eval/tasks (arith_mc, gsm8k_local) or task YAML paths",
        ),  # fmt: skip
        "limit": Field(
            float | None,
            None,
            "first N documents per task (null: all); a fraction below 1 takes that share",
            above=0.0,
        ),
        "num_fewshot": Field(
            int | None, None, "few-shot examples per prompt (null: each task's own)", minimum=0
        ),
        "batch_size": Field(
            int | None, 8, "requests per forward pass (larger is faster until memory runs out)", minimum=1
        ),
        "max_length": Field(
            int | None, None, "context length (null: the model config's max_position_embeddings)", minimum=1
        ),
        "max_gen_toks": Field(
            int | None, 256, "new-token budget for generation tasks that set none", minimum=1
        ),
        "gen_kwargs": Field(
            dict | None,
            None,
            "generation settings overriding the tasks' ({max_gen_toks: 64, temperature: 0})",
        ),
        "apply_chat_template": Field(
            bool | None, False, "wrap prompts in the tokenizer's chat template (instruct models)"
        ),
        "task_dirs": Field(list[str] | None, [], "extra folders of lm-eval task YAMLs"),
        "dtype": _DTYPE.but(
            type=str | None,
            default=None,
            doc="fp32 or bf16 (null: fp32 on CPU, bf16 on CUDA)",
            expect="fp32, bf16 or null",
        ),
        "device": _DEVICE.but(default="auto", doc="cpu, cuda or auto"),
        "quantize_base": Field(
            bool | None, False, "LoRA adapters only: keep the base in NF4 as QLoRA trained it"
        ),
        "seed": Field(int | None, 0, "seed for lm-eval's few-shot sampling and any sampled generation"),
        "run": Field(
            str | int | None,
            None,
            "tracker run (id, name or prefix) the scores belong to (null: TUNEBENCH_RUN_ID, else none)",
        ),
        "step": Field(
            int | None, None, "training step of the checkpoint, stored with the scores (null: 0)", minimum=0
        ),
        "checkpoint_label": Field(
            str | None,
            None,
            "stored as the scores' checkpoint (null: the model folder); 'base' marks a run's base-model scores",
        ),
        "output_dir": Field(
            str | None, None, "folder for eval/step_<N>.json with lm-eval's full results (null: not written)"
        ),
        "resume": Field(
            bool | str | None, False, "accepted for the launcher's resume; evaluation simply runs again"
        ),
    },
    checks=(_model_and_tasks_given,),
    max_nproc=1,
    nproc_note="evaluation runs on one process",
    absent={
        c: "evaluation trains nothing"
        for c in (
            "lora_rank",
            "optimizer",
            "activation_checkpointing",
            "optimizer_in_bwd",
            "linear_ce",
            "compile",
            "packing",
        )
    },  # fmt: skip
)


def check_config(cfg: dict) -> dict:
    """`cfg` with defaults filled in (null means the default). Raises ConfigError for unknown keys
    (did-you-mean), a missing `model_dir`/`tasks`, values of the wrong kind (all from
    `engine.config.validate`), or a `task_dirs` entry that is not a folder."""
    from engine.config import validate

    problems = validate(cfg, recipe="eval")
    if problems:
        raise ConfigError.from_problem(problems[0])
    out = CONFIG_SCHEMA.fill({k: v for k, v in cfg.items() if v is not None})
    for folder in out["task_dirs"] or ():
        if not Path(folder).expanduser().is_dir():
            raise ConfigError(
                f"{folder} is not a folder", hint="give folders of lm-eval task YAMLs", field="task_dirs"
            )
    return out


class EvalRecipe:
    """Loads the model, runs the tasks, records the scores. `run()` returns the `EvalReport`."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = check_config(cfg)

    def _model_dir(self) -> Path:
        spec = str(self.cfg["model_dir"])
        if spec == "demo":
            from engine.models.demo_model import demo_model_dir

            return Path(demo_model_dir())
        folder = Path(spec).expanduser()
        if not folder.is_dir():
            raise ConfigError(
                f"{folder} is not a model folder (no such folder)",
                hint="point it at a Hugging Face model folder, a run's checkpoints/step_<N>/model, or demo",
                field="model_dir",
            )
        return folder

    def _run_id(self) -> str | None:
        ref = self.cfg["run"] or os.environ.get("TUNEBENCH_RUN_ID") or None
        if ref is None:
            return None
        from engine.tracking.db import open_db
        from engine.tracking.readers import get_run
        from engine.tracking.tracker_errors import TrackerError

        try:
            with open_db(create=False) as db:
                return get_run(str(ref), db=db).id
        except TrackerError as exc:  # no such run, or no tracker database at all
            raise ConfigError(
                f"{ref!r} is not a tracker run ({exc})",
                hint="set run to one from `tunebench runs`, or null",
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
        label = cfg["checkpoint_label"] or str(folder)
        logger = MetricLogger(run_id=run_id, echo=False)
        try:
            for score in report.scores:
                logger.eval_result(step, score.task, score.metric, score.value, checkpoint=label)
            summary = ", ".join(f"{s.task} {s.metric} {s.value:.4g}" for s in report.scores)
            where = f"base model {folder}" if label == BASE_CHECKPOINT else str(folder)
            logger.event(step, "eval", f"{where}: {summary}")
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
