"""Gradient accumulation that equals the full batch exactly.

Rule for recipes: an optimizer step covers `G` micro-batches on each of `W` ranks. Count the
non-ignored label tokens of ALL of them first (`count_step_tokens`, all-reduced over ranks), compute
each micro-batch loss with `reduction="sum"`, and call backward on
`scale_for_step(loss_sum, total_tokens, world_size)` = `loss_sum * W / total_tokens`. FSDP averages
gradients over ranks (divides by `W`), so the gradient is d(sum of all token losses)/total_tokens:
the mean over every token of the step, whatever the split. Averaging per-micro-batch means instead
weights tokens of short micro-batches more and does NOT match the full batch. The loss to log is
the sum of the scaled losses (all-reduced and divided by `W` if each rank logs its own share).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor


def count_step_tokens(labels: Iterable[Tensor], *, ignore_index: int = -100, group=None) -> int:
    """Non-ignored label tokens over the micro-batches of one optimizer step, summed over ranks.

    Args:
        labels: the `[B, S]` label tensors of this rank's micro-batches.
        group: process group to sum over (default: the world when initialised; none otherwise).
    """
    local = sum(int((lab != ignore_index).sum()) for lab in labels)
    if dist.is_available() and dist.is_initialized():
        backend = dist.get_backend(group)
        device = (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )
        total = torch.tensor([local], dtype=torch.int64, device=device)
        dist.all_reduce(total, group=group)
        return int(total.item())
    return local


def scale_for_step(loss_sum: Tensor, total_tokens: int, world_size: int = 1) -> Tensor:
    """`loss_sum * world_size / total_tokens` (0 when the step has no token in the loss)."""
    return loss_sum * (world_size / max(int(total_tokens), 1))
