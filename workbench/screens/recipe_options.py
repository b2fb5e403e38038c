"""What the Recipe screen can edit in a config, and how a config maps onto a memory estimate.

A knob is a labelled setting bound to the first of its candidate dotted keys that the loaded config
has; knobs whose keys the config lacks are hidden (a DPO config has no LoRA rank when it fine-tunes
fully, a tiny test config has no `compile`). Pure functions; no textual, no torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Knob:
    label: str
    keys: tuple[str, ...]
    kind: str  # "float" | "int" | "bool" | "str"
    group: str  # "hyperparameters" | "memory"


KNOBS: tuple[Knob, ...] = (
    Knob("learning rate", ("optimizer.lr", "lr"), "float", "hyperparameters"),
    Knob("batch size", ("batch_size", "dataset.batch_size"), "int", "hyperparameters"),
    Knob("epochs", ("epochs",), "int", "hyperparameters"),
    Knob("max steps", ("max_steps", "max_steps_per_epoch"), "int", "hyperparameters"),
    Knob("grad accumulation", ("gradient_accumulation_steps",), "int", "hyperparameters"),
    Knob(
        "max seq len",
        ("max_seq_len", "tokenizer.max_seq_len", "dataset.max_seq_len"),
        "int",
        "hyperparameters",
    ),
    Knob(
        "warmup steps",
        ("lr_scheduler.num_warmup_steps", "lr_scheduler.warmup_steps", "warmup_steps"),
        "int",
        "hyperparameters",
    ),
    Knob("LoRA rank", ("model.lora_rank", "lora_rank"), "int", "memory"),
    Knob("LoRA alpha", ("model.lora_alpha", "lora_alpha"), "float", "memory"),
    Knob("dtype", ("dtype",), "str", "memory"),
    Knob("optimizer", ("optimizer._component_",), "str", "memory"),
    Knob("loss", ("loss._component_",), "str", "memory"),
    Knob(
        "activation checkpointing",
        ("enable_activation_checkpointing", "activation_checkpointing"),
        "bool",
        "memory",
    ),
    Knob("optimizer in backward", ("optimizer_in_bwd", "optimizer_in_backward"), "bool", "memory"),
    Knob(
        "linear cross-entropy",
        ("linear_cross_entropy", "loss.linear_cross_entropy", "loss.linear", "use_linear_ce"),
        "bool",
        "memory",
    ),
    Knob("compile", ("compile",), "bool", "memory"),
    Knob("packing", ("packed", "dataset.packed"), "bool", "memory"),
)


def knob(label: str) -> Knob:
    """The knob with this label."""
    return next(k for k in KNOBS if k.label == label)


def get_path(cfg: Any, key: str) -> Any:
    """`cfg["a"]["b"]` for key `a.b` (list indices allowed); raises KeyError when absent."""
    node = cfg
    for part in key.split("."):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(key)
    return node


def has_path(cfg: Any, key: str) -> bool:
    try:
        get_path(cfg, key)
    except KeyError:
        return False
    return True


def knob_key(knob: Knob, cfg: dict) -> str | None:
    """The first of the knob's keys present in `cfg`, or None (knob hidden)."""
    return next((k for k in knob.keys if has_path(cfg, k)), None)


def override_text(key: str, kind: str, raw: Any) -> str:
    """A `key=value` override for a knob's new value (booleans as true/false)."""
    if kind == "bool":
        return f"{key}={'true' if raw else 'false'}"
    return f"{key}={str(raw).strip()}"


def method_of(cfg: dict) -> str:
    """full | lora | qlora, read from the model component (name or `quantize_base`)."""
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    comp = str(model.get("_component_", "")).lower()
    if model.get("quantize_base") or "qlora" in comp:
        return "qlora"
    if "lora" in comp or "lora_rank" in model:
        return "lora"
    return "full"


def _first(cfg: dict, keys: tuple[str, ...], default: Any = None) -> Any:
    for k in keys:
        if has_path(cfg, k):
            return get_path(cfg, k)
    return default


def training_options(cfg: dict, nproc: int = 1) -> dict[str, Any]:
    """Keyword arguments for `engine.training.memory_estimate.TrainingOptions` read from a config."""
    opt = str(_first(cfg, ("optimizer._component_",), "adamw")).lower()
    optimizer = (
        "adamw8bit" if "8bit" in opt else "adamw4bit" if "4bit" in opt else "sgd" if "sgd" in opt else "adamw"
    )
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    dtype = str(cfg.get("dtype") or "bf16")
    out = dict(
        method=method_of(cfg),
        dtype=dtype if dtype in ("bf16", "fp16", "fp32", "float32", "bfloat16", "float16") else "bf16",
        batch_size=int(_first(cfg, ("batch_size", "dataset.batch_size"), 1) or 1),
        seq_len=int(
            _first(cfg, ("max_seq_len", "tokenizer.max_seq_len", "dataset.max_seq_len"), 2048) or 2048
        ),
        optimizer=optimizer,
        activation_checkpointing=bool(_first(cfg, knob("activation checkpointing").keys, False)),
        optimizer_in_backward=bool(_first(cfg, knob("optimizer in backward").keys, False)),
        linear_cross_entropy=bool(_first(cfg, knob("linear cross-entropy").keys, False))
        or "linearcrossentropy" in str(_first(cfg, ("loss._component_",), "")).lower().replace("_", ""),
        nproc=max(1, int(nproc)),
    )
    if out["method"] != "full":
        out["lora_rank"] = int(model.get("lora_rank") or 8)
        mods = model.get("lora_attn_modules") or ["q_proj", "v_proj"]
        out["lora_attn_modules"] = tuple(
            m for m in mods if m in ("q_proj", "k_proj", "v_proj", "output_proj", "o_proj")
        )
        out["lora_mlp"] = bool(model.get("apply_lora_to_mlp"))
    return out


SHAPE_ARGS = (
    "num_layers",
    "embed_dim",
    "dim",
    "num_heads",
    "num_kv_heads",
    "intermediate_dim",
    "vocab_size",
    "head_dim",
)


def model_shape_source(cfg: dict) -> dict[str, Any] | str:
    """The model's shape as a mapping (an HF `config.json` read from the model's checkpoint folder),
    or the builder's dotted name to look up among the model cards."""
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    for folder in (
        *(model.get(k) for k in ("checkpoint_dir", "model_dir", "path", "pretrained")),
        (cfg.get("checkpointer") or {}).get("checkpoint_dir"),
        cfg.get("checkpoint_dir"),
    ):
        if folder and (Path(str(folder)).expanduser() / "config.json").is_file():
            return json.loads((Path(str(folder)).expanduser() / "config.json").read_text())
    return str(model.get("_component_", ""))


def card_with_overrides(card: Any, model_node: dict) -> dict[str, Any]:
    """A card as a dict, with the sizes the config's model node sets itself (a builder called with
    explicit `num_layers`, `embed_dim`, ...) taking precedence."""
    if isinstance(card, dict):
        out = dict(card)
    elif hasattr(card, "__dataclass_fields__"):
        out = {f: getattr(card, f) for f in card.__dataclass_fields__}
    else:
        out = dict(vars(card))
    out.update({k: v for k, v in model_node.items() if k in SHAPE_ARGS and v is not None})
    if "tie_word_embeddings" in model_node:
        out["tied_embeddings"] = bool(model_node["tie_word_embeddings"])
    return out
