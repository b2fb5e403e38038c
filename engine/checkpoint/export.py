"""Writing a trained model out: a checkpoint's `model/` folder (PEFT adapters or a Hugging Face
folder) and the merged model of a LoRA run. Every recipe calls these; they work on one process and
under FSDP2 (the gather is a collective: call on every rank; only rank 0 writes)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from engine.config import instantiate


def full_model(model: nn.Module, node: dict) -> nn.Module | None:
    """A plain module holding the full weights: `model` itself on one process; on several, a
    `meta`-built copy of `node` filled on rank 0 from the gathered state (None on the other ranks)."""
    from engine.training.distributed import rank_world

    rank, world = rank_world()
    if world == 1:
        return model
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return None
    with torch.device("meta"):
        shell = instantiate(node)
    shell.load_state_dict(full, strict=False, assign=True)
    return shell


def _export_dtype(model_dir: Path | None, dtype: torch.dtype) -> torch.dtype | None:
    """Keep the starting folder's dtype when there is one; a randomly initialised model is saved as trained."""
    return None if model_dir is not None else dtype


def write_model_folder(
    model: nn.Module,
    node: dict,
    folder: Path,
    *,
    is_lora: bool,
    model_dir: Path | None,
    dtype: torch.dtype,
    config_updates: dict | None = None,
) -> None:
    """Fill a checkpoint's `model/` folder: PEFT adapters for LoRA, a Hugging Face model folder otherwise
    (`config_updates`: fields set in its `config.json`, see `save_pretrained`)."""
    from engine.checkpoint import save_pretrained
    from engine.checkpoint.peft import save_adapters

    model = full_model(model, node)
    if model is None:
        return
    if is_lora:
        save_adapters(model, folder, base_model_dir=model_dir)
    else:
        save_pretrained(
            model,
            folder,
            like=model_dir,
            dtype=_export_dtype(model_dir, dtype),
            config_updates=config_updates,
        )


def write_merged_model(
    model: nn.Module, node: dict, folder: Path, *, model_dir: Path | None, dtype: torch.dtype
) -> None:
    """`folder`: a LoRA model's adapters folded into the base, a Hugging Face folder transformers loads."""
    from engine.checkpoint.peft import save_merged_model

    model = full_model(model, node)
    if model is not None:
        save_merged_model(model, folder, like=model_dir, dtype=_export_dtype(model_dir, dtype))
