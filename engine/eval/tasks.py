"""Task specs for lm-eval: the project's offline task files, YAML paths, and lm-eval's own tasks.

`--tasks a,b` entries are resolved in order:
1. a `.yaml` file path: read by `engine.eval.task_yaml` (lm-eval's `!function` tags resolve beside
   the file, `include:` merges another file);
2. a task in `configs/eval/tasks/` (or another `task_dirs` folder): `<name>.yaml` there;
3. anything else: a task/group name lm-eval knows (Hub-backed tasks such as `hellaswag`).
For 1 and 2, relative `dataset_kwargs.data_files` paths are taken relative to the YAML file, so a
task folder can carry its data (lm-eval itself would read them relative to the working directory).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from engine.eval.eval_errors import EvalError

BUILTIN_TASK_DIR = Path(__file__).resolve().parents[2] / "configs" / "eval" / "tasks"


def split_tasks(tasks: str | Sequence[str]) -> list[str]:
    """`"a,b"` or `["a", "b,c"]` -> `["a", "b", "c"]`. Raises EvalError when empty."""
    items = [tasks] if isinstance(tasks, str) else list(tasks)
    names = [part.strip() for item in items for part in str(item).split(",") if part.strip()]
    if not names:
        raise EvalError("tasks: no task given; name one, e.g. --tasks arith_mc")
    return names


def _resolve_files(value: Any, base: Path) -> Any:
    if isinstance(value, str):
        path = Path(value).expanduser()
        if "://" in value or path.is_absolute():
            return str(path)
        return str((base / path).resolve())
    if isinstance(value, list):
        return [_resolve_files(v, base) for v in value]
    if isinstance(value, dict):
        return {k: _resolve_files(v, base) for k, v in value.items()}
    return value


def load_task_file(path: str | os.PathLike) -> dict:
    """A task YAML as an lm-eval config dict, with relative `data_files` made absolute.

    Raises EvalError when the file is unreadable, not a single task, or names data files that
    do not exist (naming the file and what to change).
    """
    from engine.eval.task_yaml import load_task_yaml

    path = Path(path).expanduser().resolve()
    try:
        cfg = load_task_yaml(path)
    except (OSError, ValueError, ImportError, AttributeError) as exc:
        raise EvalError(f"{path}: cannot read this task file ({exc}); fix the YAML") from None
    except Exception as exc:  # yaml.YAMLError and friends
        raise EvalError(f"{path}: not valid task YAML ({str(exc).splitlines()[0]}); fix the YAML") from None
    if "task" not in cfg:
        raise EvalError(f"{path}: no `task:` name; a task file needs `task: <name>`")
    kwargs = cfg.get("dataset_kwargs") or {}
    if "data_files" in kwargs:
        files = _resolve_files(kwargs["data_files"], path.parent)
        for file in _flat(files):
            if "://" not in file and not any(ch in file for ch in "*?[") and not Path(file).exists():
                raise EvalError(
                    f"{path}: data file {file} does not exist; fix dataset_kwargs.data_files "
                    "(relative paths are relative to the task file)"
                )
        cfg = {**cfg, "dataset_kwargs": {**kwargs, "data_files": files}}
    return cfg


def _flat(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _flat(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _flat(v)


def local_task_names(task_dirs: Sequence[str | os.PathLike] = ()) -> dict[str, Path]:
    """`{task name: yaml path}` for the YAML files directly in `configs/eval/tasks/` and `task_dirs`
    (later folders win). Files without a `task:` line are skipped."""
    found: dict[str, Path] = {}
    for folder in (BUILTIN_TASK_DIR, *map(Path, task_dirs)):
        folder = Path(folder).expanduser()
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.yaml")):
            for line in path.read_text().splitlines():
                if line.startswith("task:"):
                    found[line.split(":", 1)[1].strip().strip("'\"")] = path
                    break
    return found


def resolve_task_specs(
    tasks: str | Sequence[str], task_dirs: Sequence[str | os.PathLike] = ()
) -> list[str | dict]:
    """What `lm_eval.simple_evaluate(tasks=...)` takes: config dicts for local files, names otherwise.

    Raises EvalError for a `.yaml` path that does not exist.
    """
    local = local_task_names(task_dirs)
    specs: list[str | dict] = []
    for name in split_tasks(tasks):
        if name.endswith((".yaml", ".yml")):
            if not Path(name).expanduser().is_file():
                raise EvalError(f"tasks: {name} does not exist; give an existing task YAML or a task name")
            specs.append(load_task_file(name))
        elif name in local:
            specs.append(load_task_file(local[name]))
        else:
            specs.append(name)
    return specs
