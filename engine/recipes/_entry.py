"""A recipe's entry point and the checks it makes before building anything: the command line
(`--config FILE [overrides]`), the config against the recipe's schema, the output folder and local
files, and the exit-code contract (0 done, 1 NaN loss, 2 bad config)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from engine.config import ConfigError, find_config, load_config
from engine.training.model_setup import resolve_model_dir
from engine.training.recipe_loop import LossIsNaN


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors in one line (`... --config is required — see ... --help`), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} — see `{self.prog} --help`\n")


def parse_recipe_args(argv: list[str] | None, *, prog: str) -> tuple[Path, list[str]]:
    """`--config FILE [key=value ...]` -> `(config path, overrides)`; argparse exits 2 on misuse."""
    parser = _OneLineParser(prog=prog, description="Run the recipe on a YAML config.")
    parser.add_argument("--config", required=True, help="YAML config file (or a built-in name)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, ~key deletes")
    args = parser.parse_args(argv)
    return Path(args.config), list(args.overrides)


def _looks_local(source: str) -> bool:
    """The data loader's rule: a path (`/`, `~`, `./`, `..`) or a data file name, not a Hub dataset name."""
    from engine.data.sources import local_kind

    return (
        any(sep in source for sep in ("./", "/.", "\\"))
        or source.startswith(("/", "~"))
        or local_kind(Path(source)) is not None
    )


def _dataset_sources(node: Any, where: str):
    """`(field, source)` of every local-looking `source:` in a dataset node, a list of them or a mix."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _dataset_sources(item, f"{where}.{i}")
    elif isinstance(node, dict):
        source = node.get("source")
        if isinstance(source, str) and source.strip() and _looks_local(source):
            yield f"{where}.source", source
        if isinstance(node.get("datasets"), list):  # engine.data.mix
            yield from _dataset_sources(node["datasets"], f"{where}.datasets")


def check_local_paths(cfg: dict) -> None:
    """Refuse a missing local file the run would only open later, before any model is built or loaded:
    dataset sources (also of `validation.dataset` and mixes), `tokenizer.path`, `checkpoint_dir`,
    `teacher_checkpoint_dir` (KD) and `reward_checkpoint_dir` / `value_checkpoint_dir` (PPO), each named
    as itself. (Not in `validate`: built-in configs name models not downloaded yet.)

    Raises:
        ConfigError: naming the field and the path, and what to change.
    """
    for key in ("checkpoint_dir", "teacher_checkpoint_dir", "reward_checkpoint_dir", "value_checkpoint_dir"):
        if isinstance(cfg.get(key), str) and cfg[key] != "demo":  # demo: made on first use, by the recipe
            resolve_model_dir(cfg[key], field=key)
    validation = cfg.get("validation")
    nodes = [("dataset", cfg.get("dataset"))]
    if isinstance(validation, dict):
        nodes.append(("validation.dataset", validation.get("dataset")))
    for where, node in nodes:
        for field, source in _dataset_sources(node, where):
            if not Path(source).expanduser().exists():
                raise ConfigError(f"{source}: no such file or folder", hint="check the path", field=field)
    tokenizer = cfg.get("tokenizer")
    loads_files = isinstance(tokenizer, dict) and str(tokenizer.get("_component_", "")).endswith(
        "load_tokenizer"
    )
    path = tokenizer.get("path") if loads_files else None
    if isinstance(path, str) and path != "demo" and not Path(path).expanduser().exists():
        raise ConfigError(
            f"{path}: no such file or folder",
            hint="point it at the model folder that holds tokenizer.json or tokenizer.model",
            field="tokenizer.path",
        )


def check_output_dir(path: str | Path) -> None:
    """Refuse an `output_dir` that cannot be created or written, before anything is built.

    Nothing is left behind: a temporary file is made and removed in the nearest existing folder on the
    way (every rank may do this at once; the names are unique).
    Raises:
        ConfigError: naming `output_dir`, the blocking path, and what to change.
    """
    import tempfile

    folder = Path(path).expanduser().absolute()
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        inside = "" if existing == folder else f", so {folder} cannot be made"
        raise ConfigError(
            f"{existing} is a file{inside}", hint="choose a folder for output_dir", field="output_dir"
        )
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".tunebench-write-test-"):
            pass
    except OSError as exc:
        raise ConfigError(
            f"cannot write in {existing} ({exc.strerror}), so checkpoints cannot go to {folder}",
            hint="choose a writable output_dir",
            field="output_dir",
        ) from None


def refuse_config_problems(cfg: dict, *, recipe: str) -> None:
    """Refuse a config with problems before anything is built.

    Raises:
        ConfigError: the first problem `engine.config.validate` finds, and how many more
            `tunebench validate` would list.
    """
    from engine.config import validate

    problems = validate(cfg, recipe=recipe)
    if problems:
        raise ConfigError.from_problems(problems)


def run_recipe_main(
    argv: list[str] | None,
    *,
    name: str,
    recipe_cls: Callable[..., Any],
    check_config: Callable[[dict], None],
) -> None:
    """A training recipe's entry point: `--config FILE [overrides]`, run, end every rank with its code.

    Exit codes (docs/ARCHITECTURE.md): 0 done or stopped by SIGTERM after a checkpoint; 1 a NaN/inf loss
    (`LossIsNaN`: its message on stderr and a `nan` event for the workbench's toast); 2 a bad config
    (`ConfigError`: one line `NAME: field: what — what to do`). Never returns: `shutdown` exits the rank.
    """
    from engine.training import init_distributed, shutdown
    from engine.training.cpu_fast_paths import cpu_fast_paths, keep_freed_memory_for_cpu_training
    from engine.training.multinode import check_shared_output_dir

    config_path, overrides = parse_recipe_args(argv, prog=f"python -m engine.recipes.{name}")
    code, recipe = 0, None
    try:
        cfg = load_config(find_config(config_path), overrides)  # a path or a built-in name
        check_config(cfg)
        check_output_dir(cfg.get("output_dir") or f"./runs/{name}")
        check_local_paths(cfg)
        dist_info = init_distributed()
        check_shared_output_dir(cfg.get("output_dir") or f"./runs/{name}")  # several nodes: one folder
        recipe = recipe_cls(cfg, dist_info=dist_info)
        recipe.setup()
        # CPU runs: keep freed buffers for the next step (process-wide, once); bf16 matmuls in fp32 on
        # CPUs without bf16 units (for the training block)
        # The allocator note is information, not a problem: stdout (the run's log), so that stderr
        # keeps the one-line contract for a bad config found once training starts.
        allocator = keep_freed_memory_for_cpu_training(recipe.device)
        if allocator and int(os.environ.get("RANK", "0")) == 0:
            print(f"{name}: {allocator}", flush=True)
        with cpu_fast_paths(recipe.device, recipe.dtype, compile=bool(cfg.get("compile", False))) as note:
            if note and int(os.environ.get("RANK", "0")) == 0:
                print(f"{name}: {note}", file=sys.stderr, flush=True)
            code = recipe.train()
    except ConfigError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        code = 2
    except LossIsNaN as exc:
        print(str(exc), file=sys.stderr)
        logger = getattr(recipe, "logger", None)
        if logger is not None:
            logger.event(getattr(recipe, "global_step", 0) + 1, "nan", str(exc))
        code = 1
    finally:
        if recipe is not None:
            recipe.cleanup()
    shutdown(code)


def recipe_entry(
    name: str, recipe_cls: Callable[..., Any]
) -> tuple[Callable[[dict], None], Callable[[list[str] | None], None]]:
    """A training recipe module's two entry points, `check_config, recipe_main = recipe_entry(...)`:
    `check_config(cfg)` refuses a config with problems before anything is built
    (`refuse_config_problems`: ConfigError with the first, and how many more), and
    `recipe_main(argv=None)` runs `--config FILE [overrides]` through `run_recipe_main` (every rank
    ends with its exit code: 0, 1 NaN, 2 config)."""
    check_config = partial(refuse_config_problems, recipe=name)

    def recipe_main(argv: list[str] | None = None) -> None:
        run_recipe_main(argv, name=name, recipe_cls=recipe_cls, check_config=check_config)

    return check_config, recipe_main
