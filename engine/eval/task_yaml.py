"""Read an lm-eval task YAML ourselves (lm-eval 0.4 keeps its loader in a private module).

What a task file may use, as lm-eval defines it:
- `!function name.attr`: the callable `attr` of `name.py` beside the YAML file (a `utils.py` of the
  task folder, say), imported from that file;
- `include: other.yaml`: the keys of `other.yaml` (relative to this file, itself read the same way)
  under this file's own keys, which win.
Anything else is plain YAML (PyYAML's safe loader). Errors are raised as they come (`OSError`,
`yaml.YAMLError`, `ImportError`, `AttributeError`); `engine.eval.tasks.load_task_file` turns them into
one line naming the file.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml


def _function_loader(base: Path) -> type[yaml.SafeLoader]:
    """A safe loader whose `!function a.b` resolves to attribute `b` of `base/a.py`."""

    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> Callable[..., Any]:
        dotted = str(loader.construct_scalar(node))
        module_name, _, attr = dotted.rpartition(".")
        if not module_name or not attr:
            raise ValueError(f"!function {dotted}: give module.function (a .py file beside the task file)")
        file = base / (module_name.replace(".", "/") + ".py")
        spec = importlib.util.spec_from_file_location(f"tunebench_task_{file.stem}", file)
        if spec is None or spec.loader is None or not file.is_file():
            raise ImportError(f"!function {dotted}: {file} does not exist")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return getattr(module, attr)

    loader = type("TaskLoader", (yaml.SafeLoader,), {})
    loader.add_constructor("!function", construct)
    return loader


def load_task_yaml(path: str | Path, _seen: frozenset[Path] = frozenset()) -> dict[str, Any]:
    """The task file at `path` as a dict, `!function` tags resolved and `include:` merged in."""
    path = Path(path).resolve()
    if path in _seen:
        raise ValueError(f"include cycle through {path}")
    with path.open(encoding="utf-8") as f:
        cfg = yaml.load(f, Loader=_function_loader(path.parent))  # noqa: S506 (a safe loader + one tag)
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise ValueError("the file is not a mapping of task keys")
    include = cfg.pop("include", None)
    if include is None:
        return cfg
    merged: dict[str, Any] = {}
    for name in [include] if isinstance(include, str) else list(include):
        other = Path(name) if Path(name).is_absolute() else path.parent / name
        merged.update(load_task_yaml(other, _seen | {path}))
    merged.update(cfg)
    return merged
