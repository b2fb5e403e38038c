"""Recipe state for exact resume: atomic step checkpoints, keep-last-K, DCP for model + optimizer.

A checkpoint is a folder `output_dir/checkpoints/step_<N>/`:

    state/                 torch.distributed.checkpoint (DCP) of {"model": trainable params, "optim": ...};
                           each rank writes its own shard, so FSDP2 runs never gather to one rank
    optim_rank<r>.pt       only for optimizers DCP cannot describe (an optimizer-in-backward wrapper)
    rng_rank<r>.pt         every rank's RNG states (python, torch CPU, CUDA, numpy)
    recipe_state.pt        rank 0: step, epoch, data-loader position, LR scheduler, anything else
    model/                 what a person uses: a HF model folder or PEFT adapters (written by the recipe)

Atomicity: everything is written into `checkpoints/.tmp_step_<N>/` and renamed to `step_<N>` only after
every rank has finished, so a run killed mid-save (kill -9, power loss) leaves the previous checkpoint as
the latest complete one; leftover temp folders are removed by the next save. A training recipe's
checkpoint is renamed only after every rank's tracker rows up to step N are committed in SQLite
(`save_training_checkpoint` flushes the logger first): a run killed right after the rename resumes at
N + 1 with the rows of step N in place, and resume drops the rows past N, so every step has its rows
exactly once. Only the last `keep_last` checkpoints are kept. `load_checkpoint` refuses a folder that is
not a complete checkpoint with a one-line `CheckpointStateError` naming it.
"""

from __future__ import annotations

import os
import random
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from engine.checkpoint.layout import (  # noqa: F401 (re-exported: the recipes' import site)
    CHECKPOINTS_DIRNAME,
    checkpoints_root,
    is_complete_checkpoint,
    latest_checkpoint,
    latest_checkpoint_step,
    list_checkpoints,
)
from engine.checkpoint.layout import RECIPE_STATE as _RECIPE_STATE
from engine.checkpoint.provenance import check_written_here, mark_written
from engine.config import ConfigError


class CheckpointStateError(ConfigError):
    """A recipe checkpoint is missing, incomplete or unreadable (one line: the path and what to do)."""


# ------------------------------------------------------------------------------------------- RNG
def capture_rng_state() -> dict[str, Any]:
    """Python, torch CPU, CUDA (when present) and numpy RNG states of this process."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (
            kind,
            torch.from_numpy(keys.astype("int64")),
            int(pos),
            int(has_gauss),
            float(cached),
        )
    except ImportError:  # pragma: no cover - numpy ships with torch's usual installs
        pass
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))


# ------------------------------------------------------------------------------------ small helpers
def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _is_plain_optimizer(optimizer: Any) -> bool:
    """A single `torch.optim.Optimizer` over the model's parameters (not a per-parameter wrapper)."""
    return isinstance(optimizer, torch.optim.Optimizer) and not hasattr(optimizer, "optimizers")


def _state_dicts(model: torch.nn.Module, optimizer: Any) -> tuple[dict, dict | None]:
    """DCP-ready `(model_sd, optim_sd)`; frozen parameters (a LoRA base) are left out of both."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    options = StateDictOptions(ignore_frozen_params=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if optimizer is not None and _is_plain_optimizer(optimizer):
            return get_state_dict(model, optimizer, options=options)
        return get_model_state_dict(model, options=options), None


# -------------------------------------------------------------------------------------- save / load
def save_checkpoint(
    output_dir: str | os.PathLike,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: Any,
    recipe_state: dict[str, Any],
    keep_last: int = 2,
    write_model: Callable[[Path], None] | None = None,
    before_publish: Callable[[], None] | None = None,
) -> Path:
    """Write `output_dir/checkpoints/step_<step>/` atomically on every rank; return its path.

    Args:
        model: the (possibly FSDP2-sharded) model; its trainable parameters go into DCP.
        optimizer: a `torch.optim.Optimizer` (DCP, sharded) or any object with `state_dict()` /
            `load_state_dict()` (saved per rank), or None.
        recipe_state: rank 0's step, epoch, data-loader position, scheduler state, ... (plain data + tensors).
        keep_last: complete checkpoints to keep (>= 1); older ones are deleted after this one is in place.
        write_model: called on every rank with the `model/` folder to fill (HF weights or PEFT adapters);
            it must write only on rank 0 but may take part in collective gathers on all ranks.
        before_publish: called on every rank once everything is written and before the folder becomes
            visible (the recipes pass their tracker logger's `flush`, so the rows of every step up to
            this one are committed first); what it raises leaves the checkpoint unpublished.
    Raises:
        ValueError: keep_last < 1.
    """
    import torch.distributed.checkpoint as dcp

    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    rank, _ = _rank_world()
    root = checkpoints_root(output_dir)
    tmp = root / f".tmp_step_{step}"
    final = root / f"step_{step}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp_step_*"):  # left by a run killed mid-save
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    _barrier()

    model_sd, optim_sd = _state_dicts(model, optimizer)
    payload = {"model": model_sd}
    if optim_sd is not None:
        payload["optim"] = optim_sd
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: saving on one rank" is expected on 1 process
        dcp.save(payload, checkpoint_id=str(tmp / "state"))
    if optimizer is not None and optim_sd is None:
        _atomic_torch_save(optimizer.state_dict(), tmp / f"optim_rank{rank}.pt")
    _atomic_torch_save(capture_rng_state(), tmp / f"rng_rank{rank}.pt")
    if write_model is not None:
        write_model(tmp / "model")
    if rank == 0:
        mark_written(tmp, final)  # this home's mark: resume trusts only marked folders (provenance)
        # Written last: its presence is what makes a folder a complete checkpoint.
        _atomic_torch_save({**recipe_state, "step": step}, tmp / _RECIPE_STATE)
    if before_publish is not None:
        before_publish()
    _barrier()  # every rank's files and `before_publish` are done before rank 0 publishes

    if rank == 0:
        _publish(tmp, final)
        for _, path in list_checkpoints(output_dir)[:-keep_last]:
            shutil.rmtree(path, ignore_errors=True)
    _barrier()
    return final


def _publish(tmp: Path, final: Path) -> None:
    """Make the complete checkpoint folder `tmp` visible as `final` (rank 0): one rename; a `final` of
    the same step saved before (SIGTERM right after a periodic save) is moved aside first and removed."""
    if final.exists():
        old = final.with_name(f".tmp_old_{final.name}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def load_checkpoint(
    path: str | os.PathLike,
    *,
    model: torch.nn.Module,
    optimizer: Any,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint written by `save_checkpoint` into `model` / `optimizer` (in place, every rank).

    Returns rank 0's recipe state (step, epoch, data position, scheduler, ...). Restores this rank's
    RNG states when `restore_rng` (the same world size as at save time is expected for RNG).
    Raises:
        CheckpointStateError: the folder is not a complete checkpoint or cannot be read.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    path = Path(path)
    rank, _ = _rank_world()
    if not is_complete_checkpoint(path) or not (path / "state").is_dir():
        raise CheckpointStateError(
            f"{path}: not a complete recipe checkpoint (no {_RECIPE_STATE} or state/); "
            "point resume at a checkpoints/step_<N> folder written by a finished save"
        )
    check_written_here(path)  # before DCP unpickles its metadata (engine.checkpoint.provenance)
    model_sd, optim_sd = _state_dicts(model, optimizer)
    payload = {"model": model_sd}
    if optim_sd is not None:
        payload["optim"] = optim_sd
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(payload, checkpoint_id=str(path / "state"))
            set_state_dict(
                model,
                optimizer if optim_sd is not None else [],
                model_state_dict=payload["model"],
                optim_state_dict=payload.get("optim", {}),
                options=StateDictOptions(ignore_frozen_params=True, strict=False),
            )
        if optimizer is not None and optim_sd is None:
            optimizer.load_state_dict(torch.load(path / f"optim_rank{rank}.pt", weights_only=True))
        recipe_state = torch.load(path / _RECIPE_STATE, weights_only=True)
        rng_file = path / f"rng_rank{rank}.pt"
        if restore_rng and rng_file.is_file():
            restore_rng_state(torch.load(rng_file, weights_only=True))
    except (Exception, CheckpointException) as exc:  # DCP's own error is a BaseException
        # Any unreadable piece (truncated file, a state saved by another model/optimizer) is a user error.
        reason, other_config = _load_failure(exc)
        hint = (
            "resume with the config this checkpoint was saved with, or set resume=false to start over"
            if other_config
            else "resume from an older checkpoints/step_<N> folder or start a new run with the same config"
        )
        raise CheckpointStateError(f"{path}: cannot load the recipe checkpoint ({reason}); {hint}") from exc
    return recipe_state


def _load_failure(exc: BaseException) -> tuple[str, bool]:
    """`(one-line reason, whether the checkpoint was written for another model/optimizer config)`.

    DCP reports a rank's failure wrapped in a `CheckpointException` (its str is a whole traceback);
    `torch.load` of a damaged file says so in a paragraph. Both are cut down to their first fact.
    """
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        exc = inner[0] if isinstance(inner, tuple) else inner
    text = " ".join(str(exc).split()) or type(exc).__name__
    if text.startswith("Weights only load failed") or "failed finding central directory" in text:
        return "a file in it is damaged or not a torch file", False
    other = text.startswith(("Size mismatch", "Missing key in checkpoint")) or "size mismatch" in text
    return text.split(". ")[0][:300], other


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
    Rank 0 drops tracker rows past the checkpoint's step, or every step's rows when it starts at step 0
    (the launcher does too; a hand-resumed run's rows stay unique) and every resume logs a `resume`
    event. Returns the saved recipe state (step, epoch, batches_in_epoch, ...); the recipe restores its
    own counters from it.
    """
    resume = cfg.get("resume", False)
    if resume in (False, None, "false"):
        return None
    path = latest_checkpoint(output_dir) if resume in (True, "true", "latest") else Path(resume)
    if path is None:  # nothing saved yet: a resumed run killed before its first checkpoint starts over
        _drop_rows_after(0, rank)  # the killed attempt's steps are trained (and logged) again
        logger.event(0, "resume", f"no checkpoint under {output_dir}/checkpoints yet: starting at step 0")
        return None
    state = load_checkpoint(path, model=model, optimizer=optimizer)
    if lr_scheduler is not None and state.get("lr_scheduler") is not None:
        lr_scheduler.load_state_dict(state["lr_scheduler"])
    _drop_rows_after(int(state["step"]), rank)
    logger.event(int(state["step"]), "resume", f"resumed from {path.name}")
    return state


def _drop_rows_after(step: int, rank: int) -> None:
    """Rank 0 of a tracked run (`TUNEBENCH_RUN_ID`): delete the run's tracker rows past `step`, which
    the resumed run writes again."""
    run_id = os.environ.get("TUNEBENCH_RUN_ID")
    if run_id and rank == 0:
        from engine.tracking import truncate_metrics_after

        truncate_metrics_after(run_id, step)


_AS_RECIPE = object()


def resume_training(recipe: Any, *counters: str, trained: nn.Module | None = None) -> dict | None:
    """Resume a training recipe when its `resume:` asks for it (`load_resume_state`) and restore its
    loop counters: `global_step`, `epoch`, `batches_in_epoch` and each attribute named in `counters`
    (an int the checkpoint holds under that name, 0 when an older checkpoint lacks it).

    `recipe` has `cfg`, `output_dir`, `model`, `optimizer`, `lr_scheduler`, `logger` and `rank`;
    `trained`: the module whose weights resume fills when it is more than `model` (PPO). Returns the
    saved recipe state, for anything else the recipe keeps (PPO's KL coefficient), or None.
    """
    state = load_resume_state(
        recipe.cfg, output_dir=recipe.output_dir, model=trained or recipe.model, optimizer=recipe.optimizer,
        lr_scheduler=recipe.lr_scheduler, logger=recipe.logger, rank=recipe.rank,
    )  # fmt: skip
    if state is None:
        return None
    recipe.global_step, recipe.epoch = int(state["step"]), int(state["epoch"])
    recipe.batches_in_epoch = int(state["batches_in_epoch"])
    for name in counters:
        setattr(recipe, name, int(state.get(name, 0)))
    return state


def save_training_checkpoint(
    recipe: Any,
    *counters: str,
    extra: dict | None = None,
    trained: Any = None,
    is_lora: Any = _AS_RECIPE,
    model_dir: Any = _AS_RECIPE,
    config_updates: dict | None = None,
) -> Path:
    """`output_dir/checkpoints/step_<N>/` of a training recipe, atomically: its `model/` folder (PEFT
    adapters or a Hugging Face folder, `engine.checkpoint.export.write_model_folder`), the optimizer,
    the recipe state (`epoch`, `batches_in_epoch`, each attribute named in `counters`, then `extra`)
    plus the LR schedule's state; logs a `checkpoint` event. Returns the folder.

    `recipe` is any training recipe: it has `output_dir`, `global_step`, `epoch`, `batches_in_epoch`,
    `model`, `optimizer`, `lr_scheduler`, `cfg["model"]`, `is_lora`, `model_dir`, `dtype`, `keep_last`
    and `logger`. `counters` are what `resume_training` restores by the same names.
    `trained`: the module whose weights and optimizer state resume needs when it is more than `model`
    (PPO: policy and value model); `is_lora` / `model_dir`: the export's, when not the recipe's;
    `config_updates`: fields set in an exported Hugging Face folder's `config.json`.

    The folder is published only after `recipe.logger.flush()` has committed every row logged so far
    (this step's included) on every rank. Raises `TrackerError` (the checkpoint left unpublished) when
    the rows cannot be written.
    """
    from functools import partial

    from engine.checkpoint.export import write_model_folder

    scheduler = recipe.lr_scheduler
    is_lora = recipe.is_lora if is_lora is _AS_RECIPE else is_lora
    model_dir = recipe.model_dir if model_dir is _AS_RECIPE else model_dir
    state = {"epoch": recipe.epoch, "batches_in_epoch": recipe.batches_in_epoch,
             **{name: getattr(recipe, name) for name in counters}, **(extra or {})}  # fmt: skip
    path = save_checkpoint(
        recipe.output_dir, recipe.global_step, model=trained or recipe.model, optimizer=recipe.optimizer,
        recipe_state={**state, "lr_scheduler": scheduler.state_dict() if scheduler is not None else None},
        keep_last=recipe.keep_last,
        write_model=partial(write_model_folder, recipe.model, recipe.cfg["model"], is_lora=is_lora,
                            model_dir=model_dir, dtype=recipe.dtype, config_updates=config_updates),
        before_publish=recipe.logger.flush,  # never a checkpoint whose step has no rows in the tracker
    )  # fmt: skip
    recipe.logger.event(recipe.global_step, "checkpoint", str(path))
    return path
