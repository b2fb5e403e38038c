"""The training toolbox under the recipes: optimizer-in-backward, low-bit optimizers, LR schedules,
activation checkpointing/offloading, `parallelize`, process groups, gradient accumulation, meters."""

from engine.training.activation_checkpointing import apply_activation_checkpointing
from engine.training.activation_offloading import ActivationOffloading
from engine.training.distributed import DistributedInfo, build_world_mesh, init_distributed, shutdown
from engine.training.grad_accumulation import count_step_tokens, scale_for_step
from engine.training.low_bit_optimizers import (
    adamw_4bit,
    adamw_8bit,
    check_low_bit_optimizer_supported,
    optimizer_state_bytes,
)
from engine.training.lr_schedules import (
    constant_schedule_with_warmup,
    cosine_schedule_with_warmup,
    linear_schedule_with_warmup,
)
from engine.training.meters import (
    ThroughputMeter,
    count_matmul_params,
    gpu_utilization,
    measure_matmul_flops,
    memory_stats,
    mfu,
    model_flops_per_token,
    reset_peak_memory,
)
from engine.training.optimizer_in_backward import (
    OptimizerInBackward,
    check_optimizer_in_backward_allowed,
    setup_optimizer_in_backward,
)
from engine.training.parallelize import clip_grad_norm, materialize_model, parallelize
from engine.training.tensor_parallel import TP_PLAN, apply_tensor_parallel, token_losses

__all__ = [
    "TP_PLAN",
    "ActivationOffloading",
    "DistributedInfo",
    "OptimizerInBackward",
    "ThroughputMeter",
    "adamw_4bit",
    "adamw_8bit",
    "apply_activation_checkpointing",
    "apply_tensor_parallel",
    "build_world_mesh",
    "check_low_bit_optimizer_supported",
    "check_optimizer_in_backward_allowed",
    "clip_grad_norm",
    "constant_schedule_with_warmup",
    "cosine_schedule_with_warmup",
    "count_matmul_params",
    "count_step_tokens",
    "gpu_utilization",
    "init_distributed",
    "linear_schedule_with_warmup",
    "materialize_model",
    "measure_matmul_flops",
    "memory_stats",
    "mfu",
    "model_flops_per_token",
    "optimizer_state_bytes",
    "parallelize",
    "reset_peak_memory",
    "scale_for_step",
    "setup_optimizer_in_backward",
    "shutdown",
    "token_losses",
]
