"""Load the model an evaluation scores: a Hugging Face folder, or a PEFT adapter folder on its base.

A LoRA run's checkpoint (`checkpoints/step_<N>/model/`) holds PEFT adapters only
(`adapter_config.json` + `adapter_model.safetensors`); its `base_model_name_or_path` names the base
folder. The native decoder is built with matching LoRA settings, the base weights loaded, then the
adapters copied in, so the evaluated model is exactly the trained one (QLoRA bases stay NF4 when
`quantize_base=True`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from engine.eval.eval_errors import EvalError

ADAPTER_CONFIG = "adapter_config.json"
# PEFT module names -> native attention/MLP module names.
_PEFT_TARGETS = {
    "q_proj": "q_proj",
    "k_proj": "k_proj",
    "v_proj": "v_proj",
    "qkv_proj": "qkv_proj",  # Phi-3: q, k, v fused
    "o_proj": "output_proj",
    "gate_proj": "gate_proj",
    "gate_up_proj": "gate_up_proj",  # Phi-3: gate, up fused
    "up_proj": "up_proj",
    "down_proj": "down_proj",
    "lm_head": "output",
}


def is_adapter_folder(folder: str | os.PathLike) -> bool:
    """True when `folder` holds PEFT adapters (an `adapter_config.json`)."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def tokenizer_folder(folder: str | os.PathLike) -> Path:
    """The folder holding the tokenizer files: the model folder, or an adapter folder's base."""
    folder = Path(folder)
    if is_adapter_folder(folder) and not (folder / "tokenizer.json").is_file():
        return adapter_base_dir(folder)
    return folder


def adapter_base_dir(folder: str | os.PathLike) -> Path:
    """The base model folder an adapter folder names. Raises EvalError when it is absent."""
    cfg = _adapter_config(Path(folder))
    base = cfg.get("base_model_name_or_path")
    if not base:
        raise EvalError(
            f"{folder}/{ADAPTER_CONFIG}: no base_model_name_or_path; set it to the base model folder"
        )
    base_dir = Path(str(base)).expanduser()
    if str(base) == "demo":
        from engine.models.demo_model import demo_model_dir

        base_dir = Path(demo_model_dir())
    if not (base_dir / "config.json").is_file():
        raise EvalError(
            f"{folder}/{ADAPTER_CONFIG}: base model {base} is not a model folder (no config.json); "
            "fix base_model_name_or_path"
        )
    return base_dir


def _has_expert_adapters(folder: Path) -> bool:
    """Whether the PEFT folder holds per-expert adapters (`...experts.<e>.<proj>.lora_A.weight`), as
    `engine.checkpoint.peft.save_adapters` writes for a MoE model with `apply_lora_to_experts`."""
    import re

    from engine.checkpoint.hf_safetensors import read_header
    from engine.checkpoint.peft import ADAPTER_WEIGHTS

    if not (folder / ADAPTER_WEIGHTS).is_file():
        return False  # load_adapters names the missing file
    return any(re.search(r"\.experts\.\d+\.", key) for key in read_header(folder / ADAPTER_WEIGHTS))


def _adapter_config(folder: Path) -> dict:
    try:
        return json.loads((folder / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise EvalError(f"{folder}/{ADAPTER_CONFIG}: cannot be read ({exc}); re-save the adapters") from None


def load_eval_model(
    folder: str | os.PathLike,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    quantize_base: bool = False,
) -> nn.Module:
    """The native decoder for `folder` in eval mode.

    Args:
        folder: HF model folder (`config.json` + safetensors) or PEFT adapter folder.
        dtype: weight/compute dtype (default float32). device: where the weights go.
        quantize_base: adapters only: keep the frozen base in NF4 (as QLoRA trained it).
    Raises:
        EvalError / CheckpointError: not a model folder, unreadable files, adapters that do not fit.
    """
    from engine.models import from_pretrained

    folder = Path(folder).expanduser()
    if is_adapter_folder(folder):
        from engine.checkpoint.peft import load_adapters
        from engine.models._decoder_builder import LoRASettings

        cfg = _adapter_config(folder)
        targets = [str(t) for t in cfg.get("target_modules") or []]
        experts = _has_expert_adapters(folder)
        if experts:  # Mixtral's experts are w1/w3/w2 (Qwen3-MoE's are gate/up/down_proj, as dense MLPs)
            targets = [t for t in targets if t not in ("w1", "w2", "w3")]
        unknown = [t for t in targets if t not in _PEFT_TARGETS]
        if unknown:
            raise EvalError(
                f"{folder}/{ADAPTER_CONFIG}: target_modules {unknown} are not supported; "
                f"use {sorted(_PEFT_TARGETS)}"
            )
        native = [_PEFT_TARGETS[t] for t in targets]
        settings = LoRASettings(
            lora_attn_modules=tuple(
                m for m in native if m in ("q_proj", "k_proj", "v_proj", "qkv_proj", "output_proj")
            ),
            apply_lora_to_mlp=any(m in ("gate_proj", "up_proj", "gate_up_proj", "down_proj") for m in native),
            apply_lora_to_output="output" in native,
            apply_lora_to_experts=experts,
            train_router="gate" in (cfg.get("modules_to_save") or []),
            lora_rank=int(cfg.get("r", 8)),
            lora_alpha=float(cfg.get("lora_alpha", 16.0)),
            lora_dropout=0.0,
            quantize_base=quantize_base,
            use_dora=bool(cfg.get("use_dora", False)),
            use_rslora=bool(cfg.get("use_rslora", False)),
        )
        model = from_pretrained(adapter_base_dir(folder), dtype=dtype, device=device, lora=settings)
        load_adapters(model, folder)
        return model.eval()
    if not (folder / "config.json").is_file():
        raise EvalError(
            f"{folder}: not a model folder (no config.json or {ADAPTER_CONFIG}); point it at a Hugging Face "
            "model folder or a run checkpoint"
        )
    return from_pretrained(folder, dtype=dtype, device=device).eval()


def config_max_length(folder: str | os.PathLike, default: int = 2048) -> int:
    """The context length a HF config declares (`n_positions`, `max_position_embeddings`, `n_ctx`, in
    that order, as lm-eval's `hf` backend reads it), else `default`."""
    folder = Path(folder)
    if is_adapter_folder(folder) and not (folder / "config.json").is_file():
        folder = adapter_base_dir(folder)
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return default
    cfg = cfg.get("text_config") or cfg
    for key in ("n_positions", "max_position_embeddings", "n_ctx"):
        if cfg.get(key) is not None:
            return int(cfg[key])
    return default


def generation_eos_ids(folder: str | os.PathLike) -> set[int]:
    """EOS ids generation stops at, from `generation_config.json` (else `config.json`), as transformers'
    `generate` reads them."""
    folder = Path(folder)
    if is_adapter_folder(folder) and not (folder / "config.json").is_file():
        folder = adapter_base_dir(folder)
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if path.is_file():
            try:
                value = json.loads(path.read_text()).get("eos_token_id")
            except (OSError, ValueError):
                continue
            if value is None:
                continue
            return {int(v) for v in (value if isinstance(value, list) else [value])}
    return set()
