"""Meta's original Llama layout: `params.json` + `consolidated.NN.pth` (one file per model-parallel rank).

Differences from the native/HF layout: key names (`layers.{i}.attention.wq.weight`, ...), q/k rows
ordered for interleaved-pair RoPE (undone here by a per-head permutation), and tensors split
across ranks: column-parallel weights on dim 0, row-parallel ones (`wo`, `w2`) on dim 1, the
embedding on dim 1 (Llama 2) or dim 0 (Llama 3). Files are read with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import torch
from torch import nn

from engine.checkpoint.checkpoint_errors import CheckpointError
from engine.checkpoint.layout import publish_files, staging_folder

PARAMS_NAME = "params.json"

# Meta key (with {} for the layer) -> native key. Values are the dim Meta splits across ranks
# (None: replicated).
META_TO_NATIVE: dict[str, tuple[str, int | None]] = {
    "tok_embeddings.weight": ("tok_embeddings.weight", 1),  # dim 0 for Llama 3: detected on load
    "norm.weight": ("norm.weight", None),
    "output.weight": ("output.weight", 0),
    "layers.{}.attention_norm.weight": ("layers.{}.sa_norm.weight", None),
    "layers.{}.ffn_norm.weight": ("layers.{}.mlp_norm.weight", None),
    "layers.{}.attention.wq.weight": ("layers.{}.attn.q_proj.weight", 0),
    "layers.{}.attention.wk.weight": ("layers.{}.attn.k_proj.weight", 0),
    "layers.{}.attention.wv.weight": ("layers.{}.attn.v_proj.weight", 0),
    "layers.{}.attention.wo.weight": ("layers.{}.attn.output_proj.weight", 1),
    "layers.{}.feed_forward.w1.weight": ("layers.{}.mlp.gate_proj.weight", 0),
    "layers.{}.feed_forward.w2.weight": ("layers.{}.mlp.down_proj.weight", 1),
    "layers.{}.feed_forward.w3.weight": ("layers.{}.mlp.up_proj.weight", 0),
}
META_IGNORED = ("rope.freqs",)


def _split_layer(key: str) -> tuple[str, str | None]:
    parts = key.split(".")
    if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit():
        return ".".join(["layers", "{}", *parts[2:]]), parts[1]
    return key, None


def meta_to_native_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """q/k weight `[n_heads*hd, D]` from interleaved-pair rows to rotate-half rows (per head)."""
    rows, dim = w.shape
    hd = rows // n_heads
    return w.view(n_heads, hd // 2, 2, dim).transpose(1, 2).reshape(rows, dim)


def native_to_meta_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of `meta_to_native_rows`."""
    rows, dim = w.shape
    hd = rows // n_heads
    return w.view(n_heads, 2, hd // 2, dim).transpose(1, 2).reshape(rows, dim)


def _shard_paths(model_dir: Path) -> list[Path]:
    paths = sorted(model_dir.glob("consolidated.*.pth"))
    if not paths:
        raise CheckpointError(f"{model_dir}: no consolidated.NN.pth files; point to a Meta checkpoint folder")
    expected = [f"consolidated.{i:02d}.pth" for i in range(len(paths))]
    if [p.name for p in paths] != expected:
        raise CheckpointError(
            f"{model_dir}: shard files {[p.name for p in paths]} are not {expected}; a shard is missing"
        )
    return paths


def read_params(model_dir: str | os.PathLike) -> dict:
    """`params.json` as a dict. Raises CheckpointError when missing or not JSON."""
    path = Path(model_dir) / PARAMS_NAME
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; a Meta checkpoint folder needs params.json")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc}); re-download it") from None


def _load_shard(path: Path) -> dict[str, torch.Tensor]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises several types for corrupt zips/pickles
        raise CheckpointError(
            f"{path}: cannot be read ({type(exc).__name__}); the file is corrupt, re-download it"
        ) from None


def _decoder_kwargs(params: dict, state: dict[str, torch.Tensor], source: str) -> dict:
    from engine.modules.rotary import Llama3RopeScaling

    try:
        dim, n_heads = int(params["dim"]), int(params["n_heads"])
        n_layers = int(params["n_layers"])
    except KeyError as exc:
        raise CheckpointError(f"{source}: field {exc.args[0]} is missing; re-download params.json") from None
    embeddings = state["tok_embeddings.weight"]
    scaling = None
    if params.get("use_scaled_rope"):
        defaults = Llama3RopeScaling()
        scaling = Llama3RopeScaling(
            factor=float(params.get("rope_scaling_factor", 8.0)),
            low_freq_factor=float(params.get("rope_low_freq_factor", defaults.low_freq_factor)),
            high_freq_factor=float(params.get("rope_high_freq_factor", defaults.high_freq_factor)),
            original_max_position_embeddings=int(
                params.get("rope_original_max_position_embeddings", defaults.original_max_position_embeddings)
            ),
        )
    tied = "output.weight" not in state or torch.equal(state["output.weight"], embeddings)
    return dict(
        vocab_size=int(embeddings.shape[0]),
        num_layers=n_layers,
        num_heads=n_heads,
        num_kv_heads=int(params.get("n_kv_heads") or n_heads),
        embed_dim=dim,
        intermediate_dim=int(state["layers.0.feed_forward.w1.weight"].shape[0]),
        max_seq_len=int(params.get("max_seq_len", 131_072 if scaling else 4096)),
        norm_eps=float(params.get("norm_eps", 1e-5)),
        rope_base=float(params.get("rope_theta", 10000.0)),
        rope_scaling=scaling,
        tie_word_embeddings=tied,
    )


def _merge_shards(shards: list[dict[str, torch.Tensor]], dim: int, source: str) -> dict[str, torch.Tensor]:
    merged: dict[str, torch.Tensor] = {}
    for key in shards[0]:
        if key in META_IGNORED:
            continue
        template, _ = _split_layer(key)
        if template not in META_TO_NATIVE:
            raise CheckpointError(f"{source}: key {key} is not part of a Llama checkpoint; check the folder")
        split = META_TO_NATIVE[template][1]
        parts = [s[key] for s in shards]
        if split is None or len(parts) == 1:
            merged[key] = parts[0]
        elif key == "tok_embeddings.weight":
            merged[key] = torch.cat(parts, dim=0 if parts[0].shape[1] == dim else 1)
        else:
            merged[key] = torch.cat(parts, dim=split)
    return merged


def load_meta(
    model_dir: str | os.PathLike,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    *,
    lora=None,
) -> nn.Module:
    """A native Llama decoder from Meta's format (`params.json` + `consolidated.NN.pth`).

    Args: as `engine.models.from_pretrained` (`lora`: optional `LoRASettings`).
    Raises CheckpointError for missing/corrupt files, unknown keys and shape mismatches.
    """
    from engine.checkpoint.hf_safetensors import _materialize_rest
    from engine.models._decoder_builder import build_decoder

    model_dir = Path(model_dir)
    params = read_params(model_dir)
    shards = [_load_shard(p) for p in _shard_paths(model_dir)]
    state = _merge_shards(shards, int(params.get("dim", 0)), str(model_dir))
    kwargs = _decoder_kwargs(params, state, str(model_dir / PARAMS_NAME))
    with torch.device("meta"):
        model = build_decoder(**kwargs, lora=lora)
    device = torch.device(device)
    expected = dict(model.named_parameters())
    native: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        template, layer = _split_layer(key)
        target = META_TO_NATIVE[template][0]
        target = target if layer is None else target.format(layer)
        if target == "output.weight" and model.tied:
            continue
        if template.endswith("attention.wq.weight"):
            tensor = meta_to_native_rows(tensor, kwargs["num_heads"])
        elif template.endswith("attention.wk.weight"):
            tensor = meta_to_native_rows(tensor, kwargs["num_kv_heads"])
        if target not in expected or tuple(tensor.shape) != tuple(expected[target].shape):
            found = tuple(expected[target].shape) if target in expected else "nothing"
            raise CheckpointError(
                f"{model_dir}: key {key} has shape {tuple(tensor.shape)}, the model expects {found}; "
                "params.json and the weights disagree (or a consolidated.NN.pth shard is missing)"
            )
        native[target] = tensor.to(device=device, dtype=dtype or tensor.dtype)
    model.load_state_dict(native, strict=False, assign=True)
    del native, state, shards
    missing = _materialize_rest(model, device, dtype)
    if missing:
        raise CheckpointError(
            f"{model_dir}: weight for {missing[0]} is missing; the checkpoint is incomplete"
        )
    model.rope.rope_init(device)
    return model.eval()


def _ffn_params(dim: int, hidden: int) -> dict:
    """`multiple_of` / `ffn_dim_multiplier` for which Meta's formula gives `hidden`."""
    base = int(2 * (4 * dim) / 3)
    for multiple_of in (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1):
        if multiple_of * math.ceil(base / multiple_of) == hidden:
            return {"multiple_of": multiple_of}
    for multiple_of in (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1):
        if hidden % multiple_of:
            continue
        for mult in (round(hidden / base, 4), round(hidden / base, 2), hidden / base):
            if multiple_of * math.ceil(int(mult * base) / multiple_of) == hidden:
                return {"multiple_of": multiple_of, "ffn_dim_multiplier": mult}
    raise CheckpointError(f"intermediate size {hidden} cannot be expressed in params.json for dim {dim}")


def save_meta(
    model: nn.Module,
    out_dir: str | os.PathLike,
    *,
    like: str | os.PathLike | None = None,
    num_shards: int | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a Llama-architecture decoder in Meta's format (adapters merged, NF4 dequantised).

    Args:
        like: a Meta folder whose shard count, embedding split, dtype, `params.json` and
            `tokenizer.model` are reproduced. num_shards: model-parallel files (default `like`'s or 1).
    Raises CheckpointError for models Meta's format cannot express (q/k norm, QKV bias, window).
    """
    from engine.models.hf_config import hf_config_from_model
    from engine.modules.peft.utils import merged_state_dict
    from engine.modules.rotary import Llama3RopeScaling

    config = hf_config_from_model(model)
    if config["model_type"] != "llama":
        raise CheckpointError(
            f"Meta's format holds Llama models only; this is a {config['model_type']} model"
        )
    out_dir = Path(out_dir)
    like = Path(like) if like is not None else None
    embed_split = 1
    if like is not None:
        like_shards = _shard_paths(like)
        num_shards = num_shards or len(like_shards)
        first = _load_shard(like_shards[0])
        params = read_params(like)
        if len(like_shards) > 1 and first["tok_embeddings.weight"].shape[1] == params["dim"]:
            embed_split = 0
        dtype = dtype or first["tok_embeddings.weight"].dtype
        del first
    else:
        rope = model.rope
        params = {
            "dim": config["hidden_size"],
            "n_layers": config["num_hidden_layers"],
            "n_heads": config["num_attention_heads"],
            "n_kv_heads": config["num_key_value_heads"],
            "vocab_size": config["vocab_size"],
            **_ffn_params(config["hidden_size"], config["intermediate_size"]),
            "norm_eps": config["rms_norm_eps"],
            "rope_theta": rope.base,
        }
        if rope.scaling is not None:
            params["use_scaled_rope"] = True
            params["rope_scaling_factor"] = rope.scaling.factor
            # Meta's checkpoints all use the defaults below; other values are kept in extra keys.
            defaults = Llama3RopeScaling()
            for field in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
                if getattr(rope.scaling, field) != getattr(defaults, field):
                    params[f"rope_{field}"] = getattr(rope.scaling, field)
    num_shards = num_shards or 1
    native = merged_state_dict(model, dtype=dtype)
    native_to_meta = {v[0]: k for k, v in META_TO_NATIVE.items()}
    meta: dict[str, torch.Tensor] = {}
    for key, tensor in native.items():
        template, layer = _split_layer(key)
        meta_key = native_to_meta[template] if layer is None else native_to_meta[template].format(layer)
        if template.endswith("attn.q_proj.weight"):
            tensor = native_to_meta_rows(tensor, config["num_attention_heads"])
        elif template.endswith("attn.k_proj.weight"):
            tensor = native_to_meta_rows(tensor, config["num_key_value_heads"])
        meta[meta_key] = tensor
    if model.tied:
        meta["output.weight"] = meta["tok_embeddings.weight"]
    staging = staging_folder(out_dir)
    try:
        for rank in range(num_shards):
            shard = {}
            for key, tensor in meta.items():
                split = META_TO_NATIVE[_split_layer(key)[0]][1]
                if key == "tok_embeddings.weight":
                    split = embed_split
                if split is None or num_shards == 1:
                    shard[key] = tensor.clone()
                else:
                    if tensor.shape[split] % num_shards:
                        raise CheckpointError(
                            f"{key}: dim {split} of size {tensor.shape[split]} does not split into {num_shards} shards"
                        )
                    shard[key] = tensor.chunk(num_shards, dim=split)[rank].clone()
            torch.save(shard, staging / f"consolidated.{rank:02d}.pth")
            del shard
        (staging / PARAMS_NAME).write_text(json.dumps(params, indent=2) + "\n")
        if like is not None:
            for name in ("tokenizer.model", "tokenizer.json"):
                if (like / name).is_file():
                    shutil.copy2(like / name, staging / name)
        publish_files(staging, out_dir, stale=list(out_dir.glob("consolidated.*.pth")))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir
