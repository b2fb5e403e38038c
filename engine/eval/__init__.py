"""Evaluation through EleutherAI's lm-evaluation-harness.

- `TunebenchLM` (`engine.eval.adapter`): the lm-eval model `tunebench` for native decoders
  (registered on import; `lm_eval --model tunebench --model_args pretrained=DIR` after
  `import engine.eval`, or `lm_eval --include_path ... ` with tunebench on the path).
- `evaluate(lm, tasks, limit=..., ...) -> EvalReport` (`engine.eval.runner`): runs tasks and flattens
  scores into `Score(task, metric, value, stderr)` rows for the tracker.
- Task specs (`engine.eval.tasks`): the offline tasks in `configs/eval/tasks/` (`arith_mc`,
  `gsm8k_local`), task YAML paths, or lm-eval's own task names.
- `load_eval_model(folder)`: a HF folder or a PEFT adapter folder on its base.
Errors are `EvalError` (a `ConfigError`): one line naming the setting.
"""

from engine.eval.adapter import TunebenchLM
from engine.eval.eval_errors import EvalError
from engine.eval.model_loading import load_eval_model
from engine.eval.runner import EvalReport, Score, evaluate, flatten_scores
from engine.eval.tasks import resolve_task_specs, split_tasks

__all__ = [
    "EvalError",
    "EvalReport",
    "Score",
    "TunebenchLM",
    "evaluate",
    "flatten_scores",
    "load_eval_model",
    "resolve_task_specs",
    "split_tasks",
]
