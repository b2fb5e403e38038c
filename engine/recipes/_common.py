"""Small helpers the recipes share. Recipes copy-and-modify their training loops; only these
loop-independent pieces live here: the command line, dtypes, seeding, a resumable batch sampler,
the SIGTERM flag, calling a decoder for its hidden states, and the entry point's exit-code contract."""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.config import ConfigError, find_config, load_config

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


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


def parse_dtype(name: str, *, field: str = "dtype") -> torch.dtype:
    """`fp32` / `bf16` (or their long names) -> torch dtype. Raises ConfigError otherwise."""
    try:
        return DTYPES[str(name).lower()]
    except KeyError:
        raise ConfigError(f"unknown dtype {name!r}", hint="use fp32 or bf16", field=field) from None


def pick_device(name: str | None) -> torch.device:
    """`cpu`, `cuda`, or `auto`/None (CUDA when present). Raises ConfigError for cuda without a GPU."""
    name = (name or "auto").lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            "cuda requested but no CUDA device is visible", hint="set device=cpu", field="device"
        )
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise ConfigError(f"unknown device {name!r}", hint="use cpu, cuda or auto", field="device")
    return torch.device(name)


def set_seed(seed: int) -> None:
    """Seed python, torch (CPU + CUDA) and numpy; every rank uses the same seed."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass


class EpochBatchSampler:
    """Batches of dataset indices for one rank, reproducible per `(seed, epoch)`, resumable mid-epoch.

    Every epoch draws one permutation of the whole dataset from `seed + epoch` (the same on every
    rank), cuts it to a multiple of `world_size * batch_size`, and gives rank `r` the indices
    `perm[r::world_size]` in batches of `batch_size`. So the global batch `k` (all ranks together)
    holds the same samples whatever the world size, which is what makes 1 rank with batch 4 and
    2 ranks with batch 2 the same training run. `skip` drops the first batches of the epoch (resume).

    Args:
        num_samples (int), batch_size (int, per rank), world_size (int), rank (int), seed (int),
        shuffle (bool; default True).
    Raises:
        ConfigError: the dataset is smaller than one global batch.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        batch_size: int,
        world_size: int = 1,
        rank: int = 0,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        global_batch = batch_size * world_size
        if num_samples < global_batch:
            raise ConfigError(
                f"the dataset has {num_samples} samples, fewer than one global batch "
                f"({batch_size} x {world_size} ranks)",
                hint="lower batch_size or use more data",
                field="batch_size",
            )
        self.num_samples, self.batch_size = num_samples, batch_size
        self.world_size, self.rank, self.seed, self.shuffle = world_size, rank, seed, shuffle
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int, *, skip: int = 0) -> None:
        """Select the epoch's permutation and how many of its batches were already consumed."""
        self.epoch, self.skip = epoch, skip

    def __len__(self) -> int:
        """Batches per epoch for this rank (before `skip`)."""
        return self.num_samples // (self.batch_size * self.world_size)

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            perm = torch.randperm(self.num_samples, generator=gen)
        else:
            perm = torch.arange(self.num_samples)
        usable = len(self) * self.batch_size * self.world_size
        mine = perm[:usable][self.rank :: self.world_size].tolist()
        for b in range(self.skip, len(self)):
            yield mine[b * self.batch_size : (b + 1) * self.batch_size]


class StopFlag:
    """Set by SIGTERM (from `tunebench stop`) and checked by the loop at each optimizer step."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> StopFlag:
        def _handler(signum, frame):  # noqa: ARG001 - signal handler signature
            self.requested = True

        signal.signal(signal.SIGTERM, _handler)
        return self


@contextlib.contextmanager
def forward_replaced(model: nn.Module, forward: Callable[..., Any]) -> Iterator[None]:
    """Within the block, `model(...)` runs `forward(...)` instead of `model.forward`.

    Calling the module (rather than a method directly) keeps FSDP2's and compile's hooks in the
    path: a sharded root's parameters are gathered for the call and their gradients reduced after
    backward. The SFT recipe runs the decoder's hidden states AND the linear cross-entropy (which
    reads `model.output_weight`) inside one such call, so the output weight is gathered while used
    and the `[B,S,V]` logits never exist.
    """
    model.forward = forward
    try:
        yield
    finally:
        del model.forward


def resolve_model_dir(path: str | Path, *, field: str = "checkpoint_dir") -> Path:
    """A HF-format model folder; the word `demo` means the embedded SmolLM2-135M-Instruct.

    Raises:
        ConfigError: the folder does not exist or has no config.json (naming `field`).
    """
    if str(path) == "demo":
        from engine.models.demo import demo_model_dir

        return Path(demo_model_dir())
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file() and (folder / "adapter_config.json").is_file():
        raise ConfigError(
            f"{folder} holds LoRA adapters (adapter_config.json), not a full model",
            hint=f"point {field} at "
            "the base model folder (the adapters' base_model_name_or_path), or use `tunebench resume` to continue "
            "training those adapters",
            field=field,
        )
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"{folder} is not a model folder (no config.json)",
            hint="point it at a Hugging Face model folder (tunebench download REPO_ID) or use 'demo'",
            field=field,
        )
    return folder


def build_tokenizer(node: Any) -> Any:
    """The config's `tokenizer:` component; `path: demo` means the embedded model's folder.

    Raises:
        ConfigError: no tokenizer node (naming `tokenizer`), or what building it raises.
    """
    from engine.config import instantiate

    if node is None:
        raise ConfigError(
            "tokenizer: missing — add a tokenizer component (load_tokenizer with path)", field="tokenizer"
        )
    if isinstance(node, dict) and str(node.get("path")) == "demo":
        return instantiate(node, path=str(resolve_model_dir("demo")))
    return instantiate(node)


def check_vocab(model: nn.Module, tokenizer: Any, *, field: str = "model") -> None:
    """Refuse a tokenizer whose token ids do not all fit the model's embedding table (`tok_embeddings`).

    Without this, the first batch dies in `torch.embedding` with "index out of range".
    Raises:
        ConfigError: naming `<field>.vocab_size`, the two sizes, and what to change.
    """
    rows = getattr(getattr(model, "tok_embeddings", None), "num_embeddings", None)
    size = getattr(tokenizer, "vocab_size", None)
    if isinstance(rows, int) and isinstance(size, int) and size > rows:
        raise ConfigError(
            f"the model has {rows} token embeddings but the tokenizer has {size} tokens",
            hint=f"use the model's own tokenizer, or set {field}.vocab_size to at least {size}",
            field=f"{field}.vocab_size",
        )


def check_sequence_length(
    model: nn.Module, dataset: Any, *, field: str = "dataset", model_field: str = "model"
) -> None:
    """Refuse samples longer than the model's `max_seq_len` (its RoPE table), before the first step.

    Without this, the first long batch dies in the rotary embedding with "index out of bounds".
    Datasets without `lengths()` (or models without `max_seq_len`) are not checked.
    Raises:
        ConfigError: naming `<field>.max_seq_len`, the longest sample, the limit of `model_field`
            (the config key of that model), what to set.
    """
    limit = getattr(model, "max_seq_len", None)
    lengths = getattr(dataset, "lengths", None)  # a property on some datasets, a method on others
    lengths = lengths() if callable(lengths) else lengths
    if not isinstance(limit, int) or lengths is None or len(lengths) == 0:
        return
    longest = int(max(lengths))
    if longest > limit:
        raise ConfigError(
            f"samples are up to {longest} tokens but {model_field}.max_seq_len is {limit}",
            hint=f"set the dataset's max_seq_len to {limit} or less (or raise {model_field}.max_seq_len)",
            field=f"{field}.max_seq_len",
        )


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
    dataset sources (also of `validation.dataset` and mixes), `tokenizer.path`, `checkpoint_dir` and
    `teacher_checkpoint_dir`. (Not in `validate`: built-in configs name models not downloaded yet.)

    Raises:
        ConfigError: naming the field and the path, and what to change.
    """
    for key in ("checkpoint_dir", "teacher_checkpoint_dir"):
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


def load_resume_state(
    cfg: dict,
    *,
    output_dir: Path,
    model: nn.Module,
    optimizer: Any,
    lr_scheduler: Any,
    logger: Any,
    rank: int,
) -> dict | None:
    """What `resume:` asks for, loaded into `model`, `optimizer` and `lr_scheduler`; the recipe state.

    `resume` false/null: None. `true`/`latest`: the newest checkpoint under `output_dir` (None, with a
    `resume` event saying the run starts at step 0, when nothing was saved yet); a path: that one.
    Rank 0 drops tracker rows past the checkpoint's step (the launcher does too; a hand-resumed run's
    rows stay unique) and every resume logs a `resume` event. Returns the saved recipe state (step,
    epoch, batches_in_epoch, ...); the recipe restores its own counters from it.
    """
    from engine.checkpoint.recipe_state import latest_checkpoint, load_checkpoint

    resume = cfg.get("resume", False)
    if resume in (False, None, "false"):
        return None
    path = latest_checkpoint(output_dir) if resume in (True, "true", "latest") else Path(resume)
    if path is None:  # nothing saved yet: a resumed run killed before its first checkpoint starts over
        logger.event(0, "resume", f"no checkpoint under {output_dir}/checkpoints yet: starting at step 0")
        return None
    state = load_checkpoint(path, model=model, optimizer=optimizer)
    if lr_scheduler is not None and state.get("lr_scheduler") is not None:
        lr_scheduler.load_state_dict(state["lr_scheduler"])
    run_id = os.environ.get("TUNEBENCH_RUN_ID")
    if run_id and rank == 0:
        from engine.tracking import truncate_metrics_after

        truncate_metrics_after(run_id, int(state["step"]))
    logger.event(int(state["step"]), "resume", f"resumed from {path.name}")
    return state


def refuse_config_problems(cfg: dict, *, recipe: str) -> None:
    """Refuse a config with problems before anything is built.

    Raises:
        ConfigError: the first problem `engine.config.validate` finds, and how many more
            `tunebench validate` would list.
    """
    from engine.config import validate

    problems = validate(cfg, recipe=recipe)
    if problems:
        more = (
            f" (and {len(problems) - 1} more: tunebench validate CONFIG lists them)"
            if len(problems) > 1
            else ""
        )
        raise ConfigError.from_problem(problems[0], more=more)


class LossIsNaN(RuntimeError):
    """The step's loss is not finite: the run stops as failed, keeping the last good checkpoint."""


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
        allocator = keep_freed_memory_for_cpu_training(recipe.device)
        if allocator and int(os.environ.get("RANK", "0")) == 0:
            print(f"{name}: {allocator}", file=sys.stderr, flush=True)
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
