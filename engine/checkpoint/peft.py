"""LoRA/DoRA adapters in the PEFT layout, and merged full models, for use outside tunebench.

`save_adapters` writes `adapter_config.json` + `adapter_model.safetensors` that `peft.PeftModel.
from_pretrained(transformers_model, folder)` loads unchanged: native adapter names are a rename
(`layers.0.attn.q_proj.lora_a.weight` -> `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`,
DoRA `magnitude` -> `lora_magnitude_vector`), the module part coming from the same name table as the
full weights (`engine.checkpoint.hf_keys`). `save_merged_model` folds the adapters into the base
weights and writes a Hugging Face model folder through `save_pretrained`. `load_adapters` reads a PEFT
folder back into a native LoRA model. Writes are atomic (temporary folder, then rename).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from engine.checkpoint.checkpoint_errors import CheckpointError
from engine.checkpoint.hf_keys import native_expert_to_hf, native_to_hf
from engine.checkpoint.layout import staging_folder
from engine.modules.peft.lora import LoRALinear

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
_NATIVE_TO_PEFT_SUFFIX = {
    "lora_a.weight": "lora_A.weight",
    "lora_b.weight": "lora_B.weight",
    "magnitude": "lora_magnitude_vector",
}
_PEFT_TO_NATIVE_SUFFIX = {v: k for k, v in _NATIVE_TO_PEFT_SUFFIX.items()}


def _hf_module(native_module: str) -> str:
    """HF module path of a native linear (`layers.0.attn.q_proj` -> `model.layers.0.self_attn.q_proj`)."""
    hf_weight = native_to_hf(f"{native_module}.weight")
    if hf_weight is None:
        raise CheckpointError(
            f"adapter on {native_module} has no Hugging Face module name; it cannot be exported"
        )
    return hf_weight[: -len(".weight")]


_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")  # activation checkpointing, compile


def _native_name(module_name: str) -> str:
    """A module name without wrapper segments (the names state dicts use)."""
    for part in _WRAPPER_PARTS:
        module_name = module_name.replace(part, "")
    return module_name


def lora_modules(model: nn.Module) -> dict[str, LoRALinear]:
    """The model's LoRA/DoRA linears by native module name."""
    return {_native_name(name): m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def adapter_config(model: nn.Module, *, base_model_dir: str | os.PathLike | None = None) -> dict:
    """The PEFT `LoraConfig` fields describing this model's adapters.

    Raises CheckpointError when the model has no adapters or they differ in rank, alpha or kind
    (PEFT would need per-module patterns; tunebench builders never produce that).
    """
    mods = lora_modules(model)
    moe = _moe_adapter_keys(model)
    if not mods and not moe:
        raise CheckpointError("the model has no LoRA adapters to save; save the full model instead")
    kinds = {(m.rank, float(m.alpha), m.use_dora, m.use_rslora) for m in mods.values()}
    kinds |= {
        (e.lora_rank, float(e.lora_alpha), False, e.use_rslora) for e in _expert_stacks(model) if e.lora_rank
    }
    if len(kinds) > 1:
        raise CheckpointError(
            f"adapters differ in rank/alpha/DoRA/rsLoRA ({sorted(kinds)}); export a merged model instead"
        )
    rank, alpha, use_dora, use_rslora = kinds.pop() if kinds else (8, 16.0, False, False)
    first = next(iter(mods.values()), None)
    dropout = float(first.dropout.p) if first is not None and isinstance(first.dropout, nn.Dropout) else 0.0
    targets = {_hf_module(name).rsplit(".", 1)[-1] for name in mods}
    targets |= {k.rsplit(".", 3)[-3] for k, (_, e) in moe.items() if e is not None}
    targets = sorted(targets)
    saved = sorted({k[: -len(".weight")].rsplit(".", 1)[-1] for k, (_, e) in moe.items() if e is None})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base_model_dir) if base_model_dir is not None else None,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_dora": bool(use_dora),
        "use_rslora": bool(use_rslora),
        "init_lora_weights": True,
        "modules_to_save": saved or None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "inference_mode": True,
    }


def _moe_adapter_keys(model: nn.Module) -> dict[str, tuple[str, int | None]]:
    """PEFT key -> (native key, expert index or None) for stacked expert adapters (one PEFT adapter
    per expert, as PEFT names them on per-expert linears) and routers trained with the adapters
    (PEFT `modules_to_save`)."""
    from engine.checkpoint.hf_safetensors import moe_naming
    from engine.modules.moe import MoE

    naming = moe_naming(model)
    out: dict[str, tuple[str, int | None]] = {}
    for name, module in model.named_modules():
        if not isinstance(module, MoE):
            continue
        name = _native_name(name)
        experts = module.experts
        for local in experts.adapter_names():
            proj, side = local.rsplit("_lora_", 1)
            for e in range(experts.num_experts):
                hf = native_expert_to_hf(f"{name}.experts.{proj}", e, naming)[: -len(".weight")]
                out[f"{PEFT_PREFIX}{hf}.lora_{side.upper()}.weight"] = (f"{name}.experts.{local}", e)
        if getattr(module, "router_trainable", False):
            key = f"{name}.router.weight"
            out[f"{PEFT_PREFIX}{native_to_hf(key, naming)}"] = (key, None)
    return out


def _expert_stacks(model: nn.Module) -> list:
    from engine.modules.moe import GroupedExperts

    return [m for m in model.modules() if isinstance(m, GroupedExperts)]


def to_peft_state_dict(state: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Adapter tensors of `state` (native names, full tensors) renamed to PEFT keys."""
    out: dict[str, torch.Tensor] = {}
    for module_name in lora_modules(model):
        hf_module = _hf_module(module_name)
        for native_suffix, peft_suffix in _NATIVE_TO_PEFT_SUFFIX.items():
            key = f"{module_name}.{native_suffix}"
            if key in state:
                out[f"{PEFT_PREFIX}{hf_module}.{peft_suffix}"] = state[key]
    for peft_key, (native, expert) in _moe_adapter_keys(model).items():
        if native in state:
            out[peft_key] = state[native] if expert is None else state[native][expert]
    return out


def _publish(staging: Path, out_dir: Path) -> None:
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
        os.replace(out_dir, old / "x")
        os.replace(staging, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, out_dir)


def save_adapters(
    model: nn.Module,
    out_dir: str | os.PathLike,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
    base_model_dir: str | os.PathLike | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write the adapters of `model` as a PEFT folder; returns it.

    Args:
        model: a native LoRA/DoRA model (its module tree names the adapters).
        state_dict: full (unsharded) native tensors to write instead of `model.state_dict()` (FSDP runs
            gather them first).
        base_model_dir: recorded as `base_model_name_or_path`; its tokenizer files are copied along.
        dtype: cast the adapter tensors (default: as trained).
    Raises CheckpointError: no adapters, mixed adapter kinds, or a module without an HF name.
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    config = adapter_config(model, base_model_dir=base_model_dir)
    state = state_dict if state_dict is not None else model.state_dict()
    tensors = {
        k: (v.to(dtype) if dtype is not None else v).detach().to("cpu").contiguous().clone()
        for k, v in to_peft_state_dict(state, model).items()
    }
    staging = staging_folder(out_dir)
    try:
        save_file(tensors, str(staging / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (staging / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        if base_model_dir is not None:
            for item in Path(base_model_dir).iterdir():
                if item.is_file() and item.name.startswith(
                    ("tokenizer", "special_tokens_map", "chat_template")
                ):
                    shutil.copy2(item, staging / item.name)
        _publish(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def load_adapters(model: nn.Module, adapter_dir: str | os.PathLike) -> nn.Module:
    """Copy the adapters of a PEFT folder into a native LoRA model built with the same settings.

    Raises CheckpointError: missing files, or adapters that do not match the model (name or shape).
    """
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    weights = adapter_dir / ADAPTER_WEIGHTS
    if not weights.is_file() or not (adapter_dir / ADAPTER_CONFIG).is_file():
        raise CheckpointError(
            f"{adapter_dir}: not a PEFT adapter folder (needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})"
        )
    by_peft = {}
    for module_name in lora_modules(model):
        hf_module = _hf_module(module_name)
        for peft_suffix, native_suffix in _PEFT_TO_NATIVE_SUFFIX.items():
            by_peft[f"{PEFT_PREFIX}{hf_module}.{peft_suffix}"] = f"{module_name}.{native_suffix}"
    params = {_native_name(k): v for k, v in model.named_parameters()}
    loaded = load_file(str(weights))
    moe = _moe_adapter_keys(model)
    for key, (native, expert) in moe.items():
        if key in loaded:
            target = params[native] if expert is None else params[native][expert]
            if tuple(target.shape) != tuple(loaded[key].shape):
                raise CheckpointError(
                    f"{weights}: adapter {key} has shape {tuple(loaded[key].shape)}, the model expects "
                    f"{tuple(target.shape)}; use the same lora_rank and model size"
                )
            with torch.no_grad():
                target.copy_(loaded.pop(key).to(target.dtype))
        else:
            raise CheckpointError(
                f"{weights}: adapter {key} is missing; the folder is for other LoRA settings"
            )
    for key, tensor in loaded.items():
        native = by_peft.get(key)
        if native is None or native not in params:
            raise CheckpointError(
                f"{weights}: adapter {key} has no place in this model; build it with the same LoRA settings"
            )
        if tuple(params[native].shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"{weights}: adapter {key} has shape {tuple(tensor.shape)}, the model expects "
                f"{tuple(params[native].shape)}; use the same lora_rank and model size"
            )
        with torch.no_grad():
            params[native].copy_(tensor.to(params[native].dtype))
    expected = {key for key, native in by_peft.items() if native in params}
    missing = sorted(expected - set(loaded))
    if missing:
        raise CheckpointError(
            f"{weights}: adapter {missing[0]} is missing; the folder is for other LoRA settings"
        )
    return model


def save_merged_model(
    model: nn.Module,
    out_dir: str | os.PathLike,
    *,
    like: str | os.PathLike | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Fold the adapters into the base weights and write a Hugging Face folder (transformers loads it).

    `like`: the base model folder whose layout, dtypes, config and tokenizer files are reproduced.
    """
    from engine.checkpoint.hf_safetensors import save_pretrained

    return save_pretrained(model, out_dir, like=like, dtype=dtype)
