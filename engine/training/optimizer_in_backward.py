"""Optimizer-in-backward: each parameter is updated, and its gradient freed, as soon as it is ready.

A normal step holds every gradient until `optimizer.step()`; here one optimizer per parameter steps
inside the parameter's post-accumulate-grad hook, so at most the gradients of the parameters whose
hooks have not yet run exist at once. Costs: no gradient accumulation (each backward *is* a step),
no global gradient clipping (the full norm is never known before the first update), and no
`grad_norm` metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from engine.config import ConfigError

OptimizerFactory = Callable[[Iterable[nn.Parameter]], Optimizer]


def check_optimizer_in_backward_allowed(*, gradient_accumulation_steps: int = 1, clip_grad_norm=None) -> None:
    """Raise `ConfigError` when an option conflicts with optimizer-in-backward.

    Raises:
        ConfigError: `gradient_accumulation_steps > 1` or `clip_grad_norm` set.
    """
    if int(gradient_accumulation_steps) > 1:
        raise ConfigError(
            f"{gradient_accumulation_steps} cannot be used with "
            "optimizer_in_bwd=True (every backward updates the weights)",
            hint="set gradient_accumulation_steps=1 or optimizer_in_bwd=False",
            field="gradient_accumulation_steps",
        )
    if clip_grad_norm is not None:
        raise ConfigError(
            f"{clip_grad_norm} cannot be used with optimizer_in_bwd=True (weights are "
            "updated before the full gradient norm is known)",
            hint="set clip_grad_norm=null or optimizer_in_bwd=False",
            field="clip_grad_norm",
        )


def _make_factory(optimizer: OptimizerFactory | dict) -> OptimizerFactory:
    if isinstance(optimizer, dict):
        from engine.config import instantiate

        return lambda params: instantiate(optimizer, params)
    if not callable(optimizer):
        raise ConfigError(
            f"expected a config with _component_ or a callable taking params, got {type(optimizer).__name__}",
            field="optimizer",
        )
    return optimizer


def _set_lr(group: dict, lr: float | torch.Tensor) -> None:
    value = float(lr) if isinstance(lr, torch.Tensor) else lr
    if isinstance(group["lr"], torch.Tensor):  # torchao low-bit optimizers keep lr as a tensor
        group["lr"].fill_(value)
    else:
        group["lr"] = value


class OptimizerInBackward(Optimizer):
    """One optimizer per trainable parameter, stepped from post-accumulate-grad hooks.

    It is itself a `torch.optim.Optimizer` with one param group whose `lr` every per-parameter
    optimizer copies before it steps, so an LR scheduler is attached to this object as to any
    optimizer. `step()` and `zero_grad()` do nothing: the updates happen during `backward()`.

    Args:
        named_params: `(name, parameter)` pairs to train (those with `requires_grad`).
        factory: builds an optimizer from a one-parameter list.
    """

    def __init__(self, named_params: Iterable[tuple[str, nn.Parameter]], factory: OptimizerFactory):
        named = [(n, p) for n, p in named_params if p.requires_grad]
        if not named:
            raise ConfigError("no parameter requires grad", hint="nothing to optimise", field="model")
        self.optimizers: dict[str, Optimizer] = {name: factory([p]) for name, p in named}
        first = next(iter(self.optimizers.values())).param_groups[0]["lr"]
        lr0 = float(first) if isinstance(first, torch.Tensor) else first
        super().__init__([p for _, p in named], {"lr": lr0})
        self._hooks = []
        for name, param in named:
            self._hooks.append(param.register_post_accumulate_grad_hook(self._hook_for(name)))

    def _hook_for(self, name: str):
        opt = self.optimizers[name]

        def hook(param: torch.Tensor) -> None:
            _set_lr(opt.param_groups[0], self.param_groups[0]["lr"])
            opt.step()
            opt.zero_grad(set_to_none=True)

        return hook

    @property
    def lr(self) -> float:
        """The learning rate every parameter uses for its next update."""
        return float(self.param_groups[0]["lr"])

    def step(self, closure=None):
        """No-op (updates ran in backward); kept so LR schedulers and loops can call it."""
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No-op: each gradient is freed right after its parameter's update."""

    def remove_hooks(self) -> None:
        """Detach the hooks; afterwards backward leaves gradients in `.grad` as usual."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()

    def state_dict(self) -> dict[str, Any]:
        """`{"optimizers": {param_name: state_dict}, "param_groups": [{lr, initial_lr, ...}]}`."""
        group = {k: (float(v) if isinstance(v, torch.Tensor) else v) for k, v in self.param_groups[0].items()}
        group.pop("params", None)
        return {
            "optimizers": {name: opt.state_dict() for name, opt in self.optimizers.items()},
            "param_groups": [group],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict()` returned for the same model.

        Raises:
            ConfigError: the saved parameter names differ from this model's.
        """
        saved = state_dict.get("optimizers", {})
        if set(saved) != set(self.optimizers):
            missing = sorted(set(self.optimizers) - set(saved))[:3]
            extra = sorted(set(saved) - set(self.optimizers))[:3]
            raise ConfigError(
                f"optimizer state does not match the model (missing {missing}, unexpected {extra})",
                hint="resume with the same model and trainable parameters",
                field="checkpoint",
            )
        for name, opt in self.optimizers.items():
            opt.load_state_dict(saved[name])
        for key, value in state_dict["param_groups"][0].items():
            if key == "lr":
                _set_lr(self.param_groups[0], value)
            else:
                self.param_groups[0][key] = value


def setup_optimizer_in_backward(
    model: nn.Module,
    optimizer: OptimizerFactory | dict,
    *,
    gradient_accumulation_steps: int = 1,
    clip_grad_norm: float | None = None,
) -> OptimizerInBackward:
    """Register per-parameter optimizers that step inside backward.

    Args:
        model: its trainable parameters get one optimizer each.
        optimizer: a factory `params -> Optimizer` (e.g. `functools.partial(torch.optim.AdamW, lr=1e-4)`)
            or an optimizer config node with `_component_` (instantiated with the params).
        gradient_accumulation_steps: must be 1.
        clip_grad_norm: must be None.

    Returns:
        The `OptimizerInBackward` to checkpoint and to hand to an LR scheduler.

    Raises:
        ConfigError: accumulation > 1, clipping requested, or nothing to train.
    """
    check_optimizer_in_backward_allowed(
        gradient_accumulation_steps=gradient_accumulation_steps, clip_grad_norm=clip_grad_norm
    )
    return OptimizerInBackward(model.named_parameters(), _make_factory(optimizer))
