"""Helpers around adapters: which parameters train, switching adapters off, merging for export."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator

import torch
from torch import nn

from engine.modules.moe import GroupedExperts, MoE
from engine.modules.peft.lora import LoRALinear, dequantize

ADAPTER_PARAM_NAMES = ("lora_a.weight", "lora_b.weight", "magnitude")


def get_adapter_params(model: nn.Module) -> dict[str, nn.Parameter]:
    """Adapter parameters by fully qualified name (`layers.0.attn.q_proj.lora_a.weight`, ...):
    LoRA/DoRA linears, stacked expert adapters and MoE routers built to train with them."""
    params: dict[str, nn.Parameter] = {}
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        if isinstance(module, LoRALinear):
            for local, p in module.named_parameters():
                if local in ADAPTER_PARAM_NAMES:
                    params[prefix + local] = p
        elif isinstance(module, GroupedExperts):
            for local in module.adapter_names():
                params[prefix + local] = getattr(module, local)
        elif isinstance(module, MoE) and getattr(module, "router_trainable", False):
            params[prefix + "router.weight"] = module.router.weight
    return params


def set_trainable_params(model: nn.Module, names: Iterable[str]) -> None:
    """`requires_grad = True` for exactly the parameters in `names`, False for all others.

    Raises KeyError naming any name that is not a parameter of `model`.
    """
    wanted = set(names)
    known = dict(model.named_parameters())
    unknown = sorted(wanted - set(known))
    if unknown:
        raise KeyError(f"not parameters of the model: {', '.join(unknown[:5])}")
    for name, p in known.items():
        p.requires_grad_(name in wanted)


@contextlib.contextmanager
def disable_adapters(model: nn.Module) -> Iterator[None]:
    """Within the block every LoRA/DoRA layer computes its frozen base only (the DPO reference
    policy without a second copy of the model). Restores each layer's previous state on exit."""
    layers = [m for m in model.modules() if isinstance(m, LoRALinear | GroupedExperts)]
    previous = [m.disabled for m in layers]
    for m in layers:
        m.disabled = True
    try:
        yield
    finally:
        for m, state in zip(layers, previous):
            m.disabled = state


def merged_tensor_getters(model: nn.Module) -> dict[str, Callable[[], torch.Tensor]]:
    """Like `merged_state_dict`, but each value is a zero-argument function computing the tensor,
    so a writer can merge one shard at a time instead of holding a merged copy of the model."""
    getters: dict[str, Callable[[], torch.Tensor]] = {}
    lora_modules = {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}
    experts = {name: m for name, m in model.named_modules() if isinstance(m, GroupedExperts)}
    for key, value in model.state_dict(keep_vars=True).items():
        module_name, _, local = key.rpartition(".")
        owner = lora_modules.get(module_name)
        stack = experts.get(module_name)
        if stack is not None:
            if local not in stack.adapter_names():  # adapters are folded into their stacked base
                getters[key] = functools.partial(_merged_stack, stack, local)
        elif owner is None:
            parent, _, child = module_name.rpartition(".")
            if parent in lora_modules and child in ("lora_a", "lora_b"):
                continue  # adapter factors are folded into the base weight
            getters[key] = functools.partial(_detached, value)
        elif local == "weight":
            getters[key] = functools.partial(_merged_weight, owner)
        elif local != "magnitude":
            getters[key] = functools.partial(_detached, value)
    return getters


def _detached(value: torch.Tensor) -> torch.Tensor:
    return dequantize(value.detach())


@torch.no_grad()
def _merged_stack(experts: GroupedExperts, name: str) -> torch.Tensor:
    was_disabled = experts.disabled
    experts.disabled = False
    try:
        return experts.merged(name).detach()
    finally:
        experts.disabled = was_disabled


@torch.no_grad()
def _merged_weight(layer: LoRALinear) -> torch.Tensor:
    was_disabled = layer.disabled
    layer.disabled = False
    try:
        return dequantize(layer.merged_weight())
    finally:
        layer.disabled = was_disabled


@torch.no_grad()
def merged_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The model's state dict with every adapter merged into its base weight and adapter keys
    dropped: the same keys (and shapes) as the model built without LoRA. NF4 bases are
    dequantised. `dtype` casts floating tensors (default: keep)."""
    merged = {key: get() for key, get in merged_tensor_getters(model).items()}
    if dtype is not None:
        merged = {k: v.to(dtype) if v.is_floating_point() else v for k, v in merged.items()}
    return merged
