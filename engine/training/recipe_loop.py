"""The plumbing around every recipe's own training loop, written once.

A recipe keeps its loop (what a micro-batch computes, which figures it sums, when it validates) and
calls these for what must behave the same everywhere: the start of its `__init__` (checked config,
ranks, device, the loop state), the steps in an epoch, the finite-loss guard, the optimizer step (clip,
step, zero, schedule), logging a step's figures with every rank's memory, the periodic / on-SIGTERM
checkpoint, the epoch-end checkpoint, and closing the logger. Recipes import the module
(`from engine.training import recipe_loop`) and call `recipe_loop.<name>`. Checkpoint contents and
resume are `engine.checkpoint.recipe_state`.

The `recipe` these take is the recipe object itself, read by attribute: `global_step`, `epoch`,
`batches_in_epoch`, `total_steps`, `device`, `save_every` (optimizer steps, or None), `stop` (a
`StopFlag`), `logger`, `save_checkpoint()`: what `start_recipe` sets, and the recipe's own method.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

STOPPED = "stopped by SIGTERM after a checkpoint"  # the `stopped` event's text


class LossIsNaN(RuntimeError):
    """The step's loss is not finite: the run stops as failed (exit code 1), keeping the last good
    checkpoint (`engine.recipes._entry.run_recipe_main` reports it)."""


def start_recipe(recipe: Any, schema: Any, cfg: dict, *, name: str, dist_info: Any = None) -> dict:
    """What every training recipe's `__init__` starts with; returns the checked config.

    Sets on `recipe`: `cfg` (`schema.check(cfg)`: every key checked, defaults filled in), `dist_info`,
    `rank` and `world_size` (`rank_world`), `device` (`pick_device`: the local rank's GPU under
    `dist_info`), `dtype`, `output_dir` (`./runs/<name>` when null), `seed`, `batch_size`, `epochs`;
    the loop counters `global_step`, `epoch`, `batches_in_epoch` at 0 (resume overwrites them),
    `keep_last`, `clip_grad_norm`, `save_every`; a fresh `StopFlag` as `stop` (installed at the end of
    `setup`); `logger` None until `setup` makes it.

    Raises:
        ConfigError: a config the schema refuses, or a world size it refuses (`max_nproc`,
            `nproc_check`: torchrun started by hand with too many processes).
    """
    from engine.training.distributed import rank_world
    from engine.training.runtime import parse_dtype, pick_device
    from engine.training.stop_flag import StopFlag

    recipe.cfg = cfg = schema.check(cfg)
    recipe.dist_info = dist_info
    recipe.rank, recipe.world_size = rank_world()
    if (wrong := schema.world_size_error(recipe.world_size, cfg)) is not None:
        raise wrong
    recipe.device = pick_device(cfg["device"], dist_info)
    recipe.dtype = parse_dtype(cfg["dtype"])
    recipe.output_dir = Path(cfg["output_dir"] or f"./runs/{name}")
    recipe.seed = int(cfg["seed"])
    recipe.batch_size = int(cfg["batch_size"])
    recipe.epochs = int(cfg["epochs"])
    recipe.global_step = recipe.epoch = recipe.batches_in_epoch = 0
    recipe.keep_last = int(cfg["keep_last_n_checkpoints"])
    recipe.clip_grad_norm = cfg["clip_grad_norm"]
    recipe.save_every = cfg["save_every_n_steps"]
    recipe.stop = StopFlag()
    recipe.logger = None
    return cfg


def start_setup(recipe: Any) -> None:
    """The first thing every recipe's `setup()` does: seed python, torch and numpy with `recipe.seed`
    (the same on every rank) and open this rank's `MetricLogger` as `recipe.logger` (the tracker run
    from `TUNEBENCH_RUN_ID`, or a local one)."""
    from engine.tracking import MetricLogger
    from engine.training.runtime import set_seed

    set_seed(recipe.seed)
    recipe.logger = MetricLogger.from_env(rank=recipe.rank)


def steps_per_epoch(batches: int, accum: int, max_steps: int | None, *, hint: str) -> int:
    """Optimizer steps in an epoch of `batches` micro-batches (this rank's), `accum` per step, capped
    at `max_steps` (`max_steps_per_epoch`, None: no cap).

    Raises:
        ConfigError: naming `gradient_accumulation_steps` when `accum` exceeds the epoch (`hint`: what
            to lower or add).
    """
    from engine.config import ConfigError

    per_epoch = batches // accum
    if per_epoch < 1:
        raise ConfigError(
            f"{accum} micro-batches exceed an epoch of {batches}",
            hint=hint,
            field="gradient_accumulation_steps",
        )
    return per_epoch if max_steps is None else min(per_epoch, int(max_steps))


def check_finite_loss(loss: float, step: int) -> None:
    """Raise `LossIsNaN` ("loss is nan at step N") when `loss` is NaN or infinite; `step` is the step
    being taken (the recipe's `global_step + 1`)."""
    if not math.isfinite(loss):
        raise LossIsNaN(f"loss is {'nan' if math.isnan(loss) else 'inf'} at step {step}")


def optimizer_step(
    params: Iterable[torch.nn.Parameter] | None,
    optimizer: Any,
    lr_scheduler: Any,
    clip_grad_norm: float | None,
) -> tuple[float, float | None]:
    """Clip the gradients of `params` to `clip_grad_norm` (None: measure only), step, zero the
    gradients (to None) and step the schedule. `params=None` skips the norm (optimizer-in-backward
    updated the weights in backward already; its `step()` is a no-op).

    Returns:
        `(lr, grad_norm)`: the learning rate this step used (read before the schedule moves it) and
        the global gradient norm before clipping as a float (None when `params` is None).
    """
    from engine.training.parallelize import clip_grad_norm as clip

    norm = None
    if params is not None:
        total = clip(params, float(clip_grad_norm) if clip_grad_norm is not None else None)
        norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)  # a DTensor under FSDP2
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    lr = float(optimizer.param_groups[0]["lr"])
    if lr_scheduler is not None:
        lr_scheduler.step()
    return lr, norm


def log_step(recipe: Any, metrics: dict[str, float]) -> None:
    """Log a step's `metrics` at `recipe.global_step` with the memory figures of every rank, each under
    its rank (rank 0 logs the metrics; on several nodes it gets every rank's memory through the process
    group, see `engine.training.multinode.per_rank_memory`), then the progress. Every rank calls it."""
    from engine.training.meters import memory_stats
    from engine.training.multinode import per_rank_memory

    log, step = recipe.logger, recipe.global_step
    for rank, memory in per_rank_memory(memory_stats(recipe.device), recipe.device).items():
        log.log(step, {**metrics, **memory} if rank == 0 else memory, rank=rank)
    log.set_progress(step, recipe.total_steps)


def save_or_stop(recipe: Any) -> bool:
    """After an optimizer step: checkpoint when any rank got SIGTERM or every `save_every` steps.
    Returns True (the `stopped` event logged) when the run should end now. A collective: every rank
    calls it at the same step."""
    stop = recipe.stop.requested_anywhere(recipe.device)
    if stop or (recipe.save_every and recipe.global_step % int(recipe.save_every) == 0):
        recipe.save_checkpoint()
    if stop:
        recipe.logger.event(recipe.global_step, "stopped", STOPPED)
    return stop


def end_epoch(recipe: Any) -> bool:
    """After an epoch: count it, checkpoint, and return True (the `stopped` event logged) when any rank
    got SIGTERM meanwhile. A collective, like `save_or_stop`."""
    recipe.epoch += 1
    recipe.batches_in_epoch = 0
    recipe.save_checkpoint()
    if recipe.stop.requested_anywhere(recipe.device):
        recipe.logger.event(recipe.global_step, "stopped", STOPPED)
        return True
    return False


def close_logger(logger: Any) -> None:
    """Flush and close a recipe's `MetricLogger` (None: nothing was set up)."""
    if logger is not None:
        logger.flush()
        logger.close()
