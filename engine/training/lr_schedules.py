"""LR schedules as `_component_` functions: `(optimizer, ...) -> LambdaLR`.

Step `t` (0-based, the number of optimizer steps taken so far) has factor `(t + 1) / warmup` for
`t < num_warmup_steps` (so the first update is not wasted at lr 0), then decays over the remaining
`num_training_steps - num_warmup_steps` steps. Call `scheduler.step()` once per optimizer step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from engine.config import ConfigError


def _check(num_warmup_steps: int, num_training_steps: int | None = None, min_lr_ratio: float = 0.0) -> None:
    if int(num_warmup_steps) < 0:
        raise ConfigError(
            f"must be >= 0, got {num_warmup_steps}",
            field="lr_scheduler.num_warmup_steps",
        )
    if num_training_steps is not None:
        if int(num_training_steps) < 1:
            raise ConfigError(
                f"must be >= 1, got {num_training_steps}",
                field="lr_scheduler.num_training_steps",
            )
        if int(num_warmup_steps) > int(num_training_steps):
            raise ConfigError(
                f"{num_warmup_steps} exceeds num_training_steps {num_training_steps}",
                hint="lower the warmup",
                field="lr_scheduler.num_warmup_steps",
            )
    if not 0.0 <= float(min_lr_ratio) <= 1.0:
        raise ConfigError(
            f"must be in [0, 1], got {min_lr_ratio}",
            field="lr_scheduler.min_lr_ratio",
        )


def _warmup(step: int, num_warmup_steps: int) -> float | None:
    return (step + 1) / num_warmup_steps if step < num_warmup_steps else None


def _warmup_then_decay(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float,
    shape: Callable[[float], float],
    last_epoch: int,
) -> LambdaLR:
    """Linear warmup, then the factor `min_lr_ratio + (1 - min_lr_ratio) * shape(progress)`, where
    progress goes 0 -> 1 over the steps after warmup (held at 1 past `num_training_steps`) and `shape`
    goes 1 -> 0. Raises ConfigError as `cosine_schedule_with_warmup`."""
    _check(num_warmup_steps, num_training_steps, min_lr_ratio)

    def factor(step: int) -> float:
        warm = _warmup(step, num_warmup_steps)
        if warm is not None:
            return warm
        progress = min(1.0, (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps))
        return min_lr_ratio + (1.0 - min_lr_ratio) * shape(progress)

    return LambdaLR(optimizer, factor, last_epoch)


def cosine_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    min_lr_ratio: float = 0.0,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then cosine from the base lr to `min_lr_ratio * lr`.

    Args:
        num_cycles: cosine periods over the decay; 0.5 (default) is one half-wave down.
        min_lr_ratio: floor as a fraction of the base lr; default 0.

    Raises:
        ConfigError: negative warmup, warmup > training steps, ratio outside [0, 1].
    """

    def cosine(progress: float) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * progress))

    return _warmup_then_decay(
        optimizer, num_warmup_steps, num_training_steps, min_lr_ratio, cosine, last_epoch
    )


def linear_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float = 0.0,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then a straight line down to `min_lr_ratio * lr` at `num_training_steps`.

    Raises:
        ConfigError: as `cosine_schedule_with_warmup`.
    """

    def line(progress: float) -> float:
        return 1.0 - progress

    return _warmup_then_decay(optimizer, num_warmup_steps, num_training_steps, min_lr_ratio, line, last_epoch)


def constant_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int = 0,
    num_training_steps: int | None = None,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warmup, then the base lr for good. `num_training_steps` is accepted and unused (a constant
    schedule has no end), so recipes pass it to every schedule alike.

    Raises:
        ConfigError: negative warmup.
    """
    _check(num_warmup_steps)

    def factor(step: int) -> float:
        warm = _warmup(step, num_warmup_steps)
        return 1.0 if warm is None else warm

    return LambdaLR(optimizer, factor, last_epoch)
