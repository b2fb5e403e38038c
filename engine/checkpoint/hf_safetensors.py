"""Hugging Face safetensors folders in and out, state-dict invariant.

Loading fills a model built on the `meta` device tensor by tensor (never two copies of the model),
checking every key and shape. Saving with `like=src_dir` reproduces the source layout exactly:
key names, per-key dtype, shard files and index, plus config and tokenizer files. No pickle.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from engine.checkpoint.checkpoint_errors import CheckpointError
from engine.checkpoint.hf_keys import (
    hf_expert_to_native,
    hf_to_native,
    is_ignored_hf_key,
    native_expert_to_hf,
    native_to_hf,
)
from engine.checkpoint.layout import publish_files, staging_folder

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_MAX_HEADER = 100 * 1024 * 1024
# Files copied next to the weights by save_pretrained(like=...): config, generation and tokenizer.
_SIDE_FILE_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken", ".md")

# config.json fields that must agree before a loaded model's own config is reused on save.
_SHAPE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


# ---- reading ---------------------------------------------------------------------------------
def read_header(path: Path) -> dict[str, dict]:
    """The tensor entries of a safetensors file (`{key: {dtype, shape, data_offsets}}`).

    Raises CheckpointError when the file is missing, truncated or its header is not valid.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: weight file is missing; re-download the checkpoint")
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("shorter than the 8-byte header length")
            (header_len,) = struct.unpack("<Q", raw)
            if header_len > min(size - 8, _MAX_HEADER):
                raise ValueError(f"header length {header_len} exceeds the file size {size}")
            header = json.loads(f.read(header_len))
        entries = {k: v for k, v in header.items() if k != "__metadata__"}
        data_end = max((v["data_offsets"][1] for v in entries.values()), default=0)
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise CheckpointError(f"{path}: not a valid safetensors file ({exc}); re-download it") from None
    if 8 + header_len + data_end > size:
        raise CheckpointError(
            f"{path}: truncated ({size} bytes, header promises {8 + header_len + data_end}); re-download it"
        )
    return entries


def weight_files(model_dir: Path) -> dict[str, list[str]]:
    """`{file name: [keys]}` from `model.safetensors.index.json` or the single `model.safetensors`.

    Raises CheckpointError for a folder without weights, an unreadable index or a missing shard.
    """
    model_dir = Path(model_dir)
    index = model_dir / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: unreadable index ({exc}); re-download it") from None
        files: dict[str, list[str]] = {}
        for key, name in weight_map.items():
            files.setdefault(name, []).append(key)
        for name in files:
            if not (model_dir / name).is_file():
                raise CheckpointError(
                    f"{model_dir / name}: shard listed in {INDEX_NAME} is missing; re-download it"
                )
        return files
    single = model_dir / SINGLE_NAME
    if single.is_file():
        return {SINGLE_NAME: list(read_header(single))}
    others = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if len(others) == 1:
        return {others[0]: list(read_header(model_dir / others[0]))}
    raise CheckpointError(
        f"{model_dir}: no {SINGLE_NAME} or {INDEX_NAME} found; point to a Hugging Face model folder"
    )


def _iter_tensors(path: Path, keys: list[str], device: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    entries = read_header(path)
    missing = [k for k in keys if k not in entries]
    if missing:
        raise CheckpointError(
            f"{path}: key {missing[0]} listed in the index is not in the file; re-download it"
        )
    try:
        with safe_open(str(path), framework="pt", device=device) as f:
            for key in keys:
                yield key, f.get_tensor(key)
    except SafetensorError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc}); the file is corrupt, re-download it") from None


# ---- loading into a model --------------------------------------------------------------------
def _materialize_rest(model: nn.Module, device: torch.device, dtype: torch.dtype | None) -> list[str]:
    """After base weights were assigned: give adapters (absent from base checkpoints) storage and
    initial values, re-derive DoRA magnitudes from the loaded base weights, quantise NF4 bases.
    Returns the names of parameters still on meta (those are missing from the checkpoint)."""
    from engine.modules.moe import GroupedExperts
    from engine.modules.peft.lora import LoRALinear
    from engine.modules.score_decoder import ScoreDecoder

    if isinstance(model, ScoreDecoder) and model.score.weight.is_meta:
        # a causal LM's folder: the scalar head starts fresh (normal, std 0.02, as transformers does)
        model.score.to_empty(device=device).to(dtype=dtype or model.tok_embeddings.weight.dtype)
        with torch.no_grad():
            model.score.weight.normal_(0.0, 0.02)
        model.fresh_score_head = True
    for module in model.modules():
        if isinstance(module, GroupedExperts) and not module.gate_proj.is_meta:
            for name in module.adapter_names():
                param = getattr(module, name)
                if param.is_meta:
                    target = dtype or module.gate_proj.dtype
                    setattr(module, name, nn.Parameter(torch.empty(param.shape, device=device, dtype=target)))
            if module.adapter_names():
                module.initialize_adapters()
            continue
        if not isinstance(module, LoRALinear) or module.weight.is_meta:
            continue
        factors = (module.lora_a, module.lora_b)
        if any(f.weight.is_meta for f in factors):
            target = dtype or module.weight.dtype
            for factor in factors:
                factor.to_empty(device=device).to(dtype=target)
            if module.magnitude is not None:
                module.magnitude = nn.Parameter(torch.empty(module.out_dim, device=device, dtype=target))
            module.initialize_adapters()
        elif module.magnitude is not None:
            with torch.no_grad():  # DoRA starts as the base layer: magnitude = row norms of W
                norms = module.weight.detach().float().norm(dim=1)
                module.magnitude.copy_(norms.to(module.magnitude.dtype))
        module.quantize_base_()
    return [name for name, p in model.named_parameters() if p.is_meta]


def load_hf_weights(
    model: nn.Module,
    model_dir: str | os.PathLike,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> nn.Module:
    """Fill `model` (typically built under `torch.device("meta")`) from a HF folder.

    Args:
        model: a native decoder (plain or LoRA). Parameters are replaced by the loaded tensors.
        model_dir: folder with `*.safetensors` (+ index). dtype: cast to this (default: as stored).
        device: where the weights go.
    Returns the model. Raises CheckpointError naming the key, the expected and found shapes, an
    unknown key, a missing key, or a corrupt/missing file.
    """
    model_dir = Path(model_dir)
    device = torch.device(device)
    params = dict(model.named_parameters())
    tied = getattr(model, "tied", False)
    naming = moe_naming(model)
    stacks: dict[str, torch.Tensor] = {}  # stacked expert tensors, filled expert by expert
    filled: dict[str, set[int]] = {}
    for file_name, keys in weight_files(model_dir).items():
        path = model_dir / file_name
        batch: dict[str, torch.Tensor] = {}
        for hf_key, tensor in _iter_tensors(path, keys, "cpu"):
            # a tied decoder, or a scalar-head model on a causal LM's folder, has no place for lm_head
            no_output = tied or "output.weight" not in params
            if is_ignored_hf_key(hf_key) or (no_output and hf_key == "lm_head.weight"):
                continue
            expert = hf_expert_to_native(hf_key, naming)
            if expert is not None and expert[0] in params:
                _fill_expert(stacks, filled, params[expert[0]], expert, tensor, path, hf_key, dtype, device)
                continue
            native = hf_to_native(hf_key, naming)
            if native is None or native not in params:
                raise CheckpointError(
                    f"{path}: key {hf_key} has no place in this {type(model).__name__}; "
                    "the checkpoint is for another architecture or size than config.json says"
                )
            expected = tuple(params[native].shape)
            if tuple(tensor.shape) != expected:
                raise CheckpointError(
                    f"{path}: key {hf_key} has shape {tuple(tensor.shape)}, the model expects {expected}; "
                    "config.json and the weights disagree"
                )
            batch[native] = tensor.to(device=device, dtype=dtype or tensor.dtype)
        model.load_state_dict(batch, strict=False, assign=True)
        del batch
    for native, stack in stacks.items():
        absent = sorted(set(range(stack.shape[0])) - filled[native])
        if absent:
            raise CheckpointError(
                f"{model_dir}: weight {native_expert_to_hf(native, absent[0], naming)} is missing "
                f"({len(absent)} experts of {native} missing); the checkpoint is incomplete"
            )
    model.load_state_dict(stacks, strict=False, assign=True)
    missing = _materialize_rest(model, device, dtype)
    if missing:
        hf_missing = native_to_hf(missing[0], naming) or missing[0]
        raise CheckpointError(
            f"{model_dir}: weight {hf_missing} is missing ({len(missing)} missing in all); "
            "the checkpoint is incomplete or for another architecture"
        )
    for module in model.modules():
        if hasattr(module, "rope_init"):
            module.rope_init(device)
    return model


def moe_naming(model: nn.Module) -> str | None:
    """The HF key spelling of a mixture-of-experts model (`qwen3_moe`, `mixtral`), None if dense."""
    from engine.modules.moe import moe_layers

    layers = moe_layers(model)
    return layers[0].settings.naming if layers else None


def _fill_expert(stacks, filled, param, expert, tensor, path, hf_key, dtype, device) -> None:
    native, index = expert
    expected = tuple(param.shape[1:])
    if tuple(tensor.shape) != expected or index >= param.shape[0]:
        raise CheckpointError(
            f"{path}: key {hf_key} has shape {tuple(tensor.shape)} (expert {index}), the model expects "
            f"{expected} for each of {param.shape[0]} experts; config.json and the weights disagree"
        )
    if native not in stacks:
        stacks[native] = torch.empty(param.shape, dtype=dtype or tensor.dtype, device=device)
        filled[native] = set()
    stacks[native][index].copy_(tensor)
    filled[native].add(index)


# ---- saving ----------------------------------------------------------------------------------
def _hf_tensor_getters(model: nn.Module) -> dict[str, Callable[[], torch.Tensor]]:
    """HF key -> function returning the (adapter-merged, dequantised) tensor, computed on demand."""
    from engine.modules.moe import GroupedExperts
    from engine.modules.peft.utils import merged_tensor_getters

    naming = moe_naming(model)
    experts = {name: m for name, m in model.named_modules() if isinstance(m, GroupedExperts)}
    out: dict[str, Callable[[], torch.Tensor]] = {}
    for key, getter in merged_tensor_getters(model).items():
        module_name, _, local = key.rpartition(".")
        if module_name in experts:  # one HF key per expert, merged one expert at a time
            stack = experts[module_name]
            for e in range(stack.num_experts):
                out[native_expert_to_hf(key, e, naming)] = functools.partial(stack.merged_expert, local, e)
            continue
        hf_key = native_to_hf(key, naming)
        if hf_key is None:
            raise CheckpointError(f"model parameter {key} has no Hugging Face name; it cannot be exported")
        out[hf_key] = getter
    if getattr(model, "tied", False):
        out.setdefault("lm_head.weight", out["model.embed_tokens.weight"])
    return out


def _write_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    # safetensors refuses tensors that share storage (tied weights, views): copy only those.
    owned: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, value in tensors.items():
        t = value.detach().to("cpu").contiguous()
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() != t.numel() * t.element_size():
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        owned[key] = t
    save_file(owned, str(path), metadata=metadata)


def _copy_side_files(src: Path, dst: Path) -> None:
    for item in src.iterdir():
        if item.is_file() and item.suffix in _SIDE_FILE_SUFFIXES and item.name != INDEX_NAME:
            shutil.copy2(item, dst / item.name)


def save_pretrained(
    model: nn.Module,
    out_dir: str | os.PathLike,
    *,
    like: str | os.PathLike | None = None,
    dtype: torch.dtype | None = None,
    config_updates: dict | None = None,
) -> Path:
    """Write `model` as a Hugging Face folder that transformers/vLLM load unchanged.

    Args:
        model: a native decoder; LoRA/DoRA adapters are merged and NF4 bases dequantised.
        out_dir: destination folder (created; existing weight files replaced).
        like: source HF folder whose key names, per-key dtypes, shard files, index, config and
            tokenizer files are reproduced. Without it: one `model.safetensors` in `dtype` (default the
            model's) and a `config.json` derived from the model.
        config_updates: fields set in the written `config.json` either way (a reward model's
            `pad_token_id`, which `*ForSequenceClassification` needs to find each row's last token).
    Returns `out_dir`. Files appear atomically (written to a temporary folder, then moved).
    Raises CheckpointError when the model and `like` have different keys or shapes.
    """
    out_dir = Path(out_dir)
    getters = _hf_tensor_getters(model)
    staging = staging_folder(out_dir)
    try:
        if like is not None:
            _save_like(getters, staging, Path(like))
        else:
            from engine.models.hf_config import hf_config_from_model

            state = {k: get() for k, get in getters.items()}
            target = dtype or next(iter(state.values())).dtype
            config = hf_config_from_model(model, dtype=target)
            loaded = getattr(model, "hf_config", None)
            if isinstance(loaded, dict) and all(loaded.get(k) == config[k] for k in _SHAPE_KEYS):
                # Keep the source's other fields (token ids, generation settings) when sizes agree.
                config = {
                    **loaded,
                    "torch_dtype": config["torch_dtype"],
                    "architectures": config["architectures"],
                }
                config.update(
                    {
                        k: v
                        for k, v in hf_config_from_model(model).items()
                        if k in ("num_labels", "id2label", "label2id")
                    }
                )
                config.pop("dtype", None)
            if config.get("tie_word_embeddings"):
                state.pop("lm_head.weight", None)
            state = {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}
            _write_safetensors(state, staging / SINGLE_NAME, {"format": "pt"})
            (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if config_updates:
            written = json.loads((staging / "config.json").read_text())
            (staging / "config.json").write_text(json.dumps({**written, **config_updates}, indent=2) + "\n")
        publish_files(staging, out_dir, stale=[*out_dir.glob("*.safetensors"), out_dir / INDEX_NAME])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _save_like(state: dict[str, Callable[[], torch.Tensor]], staging: Path, like: Path) -> None:
    layout = weight_files(like)
    source_keys = {k for keys in layout.values() for k in keys if not is_ignored_hf_key(k)}
    extra = sorted(set(state) - source_keys - {"lm_head.weight"})
    missing = sorted(source_keys - set(state))
    if extra or missing:
        what = (
            f"the source has {missing[0]} which the model lacks" if missing else f"the model has {extra[0]}"
        )
        raise CheckpointError(
            f"{like}: layouts differ ({what}); save without like= or pick the matching source"
        )
    weight_map: dict[str, str] = {}
    total = 0
    for file_name, keys in layout.items():
        entries = read_header(like / file_name)
        shard: dict[str, torch.Tensor] = {}
        for key in keys:
            if is_ignored_hf_key(key):
                continue
            info = entries[key]
            tensor = state[key]()  # merged/dequantised now, one shard at a time
            if list(tensor.shape) != list(info["shape"]):
                raise CheckpointError(
                    f"{like / file_name}: key {key} has shape {tuple(info['shape'])} but the model's is "
                    f"{tuple(tensor.shape)}; pick the source folder of this model size"
                )
            shard[key] = tensor.to(SAFETENSORS_DTYPES.get(info["dtype"], tensor.dtype))
            total += shard[key].numel() * shard[key].element_size()
            weight_map[key] = file_name
        _write_safetensors(shard, staging / file_name, {"format": "pt"})
        del shard
    if (like / INDEX_NAME).is_file():
        index = json.loads((like / INDEX_NAME).read_text())
        index["metadata"] = {**index.get("metadata", {}), "total_size": total}
        index["weight_map"] = dict(sorted(weight_map.items()))
        (staging / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    _copy_side_files(like, staging)
