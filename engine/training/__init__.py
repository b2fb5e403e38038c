"""The training toolbox under the recipes: optimizer-in-backward, low-bit optimizers, LR schedules,
activation checkpointing/offloading, `parallelize`, process groups, gradient accumulation, meters."""

from engine.training.lr_schedules import (
    constant_schedule_with_warmup,
    cosine_schedule_with_warmup,
    linear_schedule_with_warmup,
)
from engine.training.optimizer_in_backward import (
    OptimizerInBackward,
    check_optimizer_in_backward_allowed,
    setup_optimizer_in_backward,
)

__all__ = [
    "OptimizerInBackward",
    "check_optimizer_in_backward_allowed",
    "constant_schedule_with_warmup",
    "cosine_schedule_with_warmup",
    "linear_schedule_with_warmup",
    "setup_optimizer_in_backward",
]
