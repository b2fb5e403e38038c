"""Writing a trained policy into a checkpoint's `model/` folder (PEFT adapters or an HF folder)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from engine.config import instantiate
from engine.rl.policy import rank_world


def write_policy(
    model: nn.Module, node: dict, folder: Path, *, is_lora: bool, model_dir: Path | None, dtype: torch.dtype
) -> None:
    """Fill `folder` (called on every rank; collective under FSDP2, writes on rank 0 only)."""
    from engine.checkpoint import save_pretrained
    from engine.checkpoint.peft import save_adapters

    rank, world = rank_world()
    if world > 1:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank != 0:
            return
        with torch.device("meta"):
            shell = instantiate(node)
        shell.load_state_dict(full, strict=False, assign=True)
        model = shell
    if is_lora:
        save_adapters(model, folder, base_model_dir=model_dir)
    else:
        save_pretrained(model, folder, like=model_dir, dtype=None if model_dir is not None else dtype)
