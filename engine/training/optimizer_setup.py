"""The optimizer and LR schedule of a recipe, built the same way everywhere from its config."""

from __future__ import annotations

from typing import Any

from torch import nn

from engine.config import instantiate


def build_optimizer(
    model: nn.Module,
    optimizer: dict,
    lr_scheduler: dict | None,
    *,
    num_training_steps: int,
    in_backward: bool = False,
) -> tuple[Any, Any]:
    """`(optimizer, lr_scheduler or None)` over the parameters of `model` that require grad.

    `optimizer` / `lr_scheduler`: the config's component nodes (the schedule gets `num_training_steps`,
    in optimizer steps). `in_backward`: each parameter steps inside backward (`optimizer_in_bwd`).
    """
    if in_backward:
        from engine.training.optimizer_in_backward import setup_optimizer_in_backward

        opt = setup_optimizer_in_backward(model, optimizer)
    else:
        opt = instantiate(optimizer, [p for p in model.parameters() if p.requires_grad])
    scheduler = None
    if lr_scheduler is not None:
        scheduler = instantiate(lr_scheduler, opt, num_training_steps=num_training_steps)
    return opt, scheduler
