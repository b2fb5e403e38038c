"""Building the models the preference/RL recipes hold: the trained policy (or student), and frozen
ones (DPO/GRPO reference, KD teacher), on one process or sharded with FSDP2 over several."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from engine.config import ConfigError, instantiate
from engine.recipes._common import resolve_model_dir


def rank_world() -> tuple[int, int]:
    """`(rank, world_size)`; `(0, 1)` without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum `t` over ranks in place (a no-op on one process); returns it."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def _initialised(node: dict, model_dir: Path | None, *, dtype: torch.dtype, seed: int) -> nn.Module:
    """The full model on CPU: weights from `model_dir` (adapters seeded), or a seeded random init."""
    torch.manual_seed(seed)
    if model_dir is None:
        return instantiate(node).to(dtype=dtype)
    from engine.checkpoint import load_hf_weights

    with torch.device("meta"):
        model = instantiate(node)
    return load_hf_weights(model, model_dir, dtype=dtype)


def build_model(
    node: dict,
    checkpoint_dir: str | None,
    *,
    dtype: torch.dtype,
    seed: int,
    device: torch.device,
    trainable: bool,
    dist_info=None,
    activation_checkpointing: bool = False,
    compile: bool = False,
    fsdp_cfg: dict | None = None,
    field: str = "model",
) -> tuple[nn.Module, bool, Path | None]:
    """Build, load and place one model: `(model, is_lora, model_dir)`.

    `trainable=True`: a `lora_*` builder trains adapters only, a plain one every weight.
    `trainable=False`: every parameter frozen and the model in eval mode (reference, teacher).
    Several ranks: built on `meta`, sharded per block with FSDP2, filled from rank 0's full weights.
    Raises ConfigError for a missing model folder or a trainable model with nothing to train.
    """
    from engine.modules.peft.utils import get_adapter_params, set_trainable_params
    from engine.training import build_world_mesh, materialize_model, parallelize

    rank, world = rank_world()
    model_dir = resolve_model_dir(checkpoint_dir) if checkpoint_dir is not None else None
    if world > 1:
        with torch.device("meta"):
            model = instantiate(node)
    else:
        model = _initialised(node, model_dir, dtype=dtype, seed=seed)
    adapters = get_adapter_params(model)
    is_lora = bool(adapters) and trainable
    if not trainable:
        for p in model.parameters():
            p.requires_grad_(False)
    elif is_lora:
        set_trainable_params(model, adapters.keys())
    fsdp_cfg = dict(fsdp_cfg or {})
    model = parallelize(
        model,
        mesh=build_world_mesh(dist_info) if world > 1 else None,
        activation_checkpointing=activation_checkpointing and trainable,
        compile=compile,
        fsdp=world > 1,
        reshard_after_forward=bool(fsdp_cfg.get("reshard_after_forward", True)),
        cpu_offload=bool(fsdp_cfg.get("cpu_offload", False)),
    )
    if world > 1:
        full = _initialised(node, model_dir, dtype=dtype, seed=seed).state_dict() if rank == 0 else {}
        materialize_model(model, device=device, state_dict=full, broadcast_from_rank0=True)
        del full
    else:
        model.to(device=device)
    if trainable and not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(
            "nothing to train (no parameter requires grad)", hint="check the component", field=field
        )
    if not trainable:
        model.eval()
    return model, is_lora, model_dir


def reference_context(model: nn.Module, reference: nn.Module | None):
    """`(module, context)` computing the reference policy: the frozen copy, or — for LoRA, where
    `reference` is None — the policy itself with its adapters disabled (no second copy)."""
    if reference is not None:
        return reference, contextlib.nullcontext()
    from engine.modules.peft.utils import disable_adapters

    return model, disable_adapters(model)
