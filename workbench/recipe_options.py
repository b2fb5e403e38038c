"""What the Recipe screen can edit in a config, and how a config maps onto a memory estimate.

Two kinds of settings:

- A knob (hyperparameters) is bound to the first of its candidate dotted keys that the loaded config
  has; knobs whose keys the config lacks are hidden (a tiny test config has no warm-up).
- A control (memory/parallel options) is always shown for the recipes that read it, whether or not
  the config has its key: turning it on writes the overrides that make a valid config (swapping the
  loss or optimizer component keeps only the arguments the new component accepts). A control a
  recipe does not read is absent, with the reason in `absent_controls` (shown by the screen).

Pure functions; no textual, no torch (`recipe_problems` imports the engine's own checks lazily).

Length: just over 500 lines because the knob and control tables, the overrides each control writes and
the config -> memory-estimate mapping are one model of what the Recipe screen edits; the keys' own
declarations (type, default, bounds, doc) stay in each recipe's `CONFIG_SCHEMA`, read from here.
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
    Knob("LoRA alpha", ("model.lora_alpha", "lora_alpha"), "float", "memory"),
    Knob("dtype", ("dtype",), "str", "memory"),
)


# Memory/parallel controls ----------------------------------------------------------------------

LINEAR_CE = "engine.modules.loss.LinearCrossEntropyLoss"
CHUNKED_CE = "engine.modules.loss.ChunkedCrossEntropyLoss"
# The optimizer choice: key -> (label, component path). The low-bit ones are torchao's AdamW8bit /
# AdamW4bit behind the engine's builders, which check the device can run them.
OPTIMIZERS: dict[str, tuple[str, str]] = {
    "adamw": ("AdamW", "torch.optim.AdamW"),
    "adamw8bit": ("AdamW 8-bit", "engine.training.low_bit_optimizers.adamw_8bit"),
    "adamw4bit": ("AdamW 4-bit", "engine.training.low_bit_optimizers.adamw_4bit"),
}
AS_IN_CONFIG = "config"  # the optimizer choice that keeps a component not in OPTIMIZERS
CPU_MAX_NPROC = 8  # processes offered on a machine without GPUs (gloo ranks on CPU)


@dataclass(frozen=True)
class Control:
    """A memory/parallel option. `kind`: bool | choice | int; `effect`: what it does to memory
    (tooltip and help line)."""

    name: str
    label: str
    kind: str
    effect: str


CONTROLS: tuple[Control, ...] = (
    Control("nproc", "processes", "int", "ranks on this machine; FSDP shards weights, gradients and state"),
    Control("lora_rank", "LoRA rank", "int", "adapter size: higher rank, more trainable parameters"),
    Control("optimizer", "optimizer", "choice", "8-bit / 4-bit AdamW keep 1/4 / 1/8 of AdamW's state"),
    Control(
        "activation_checkpointing",
        "activation checkpointing",
        "bool",
        "keep block inputs only, recompute in backward: less activation memory, ~30% slower",
    ),
    Control(
        "optimizer_in_bwd",
        "optimizer in backward",
        "bool",
        "step each parameter in backward, one gradient alive at a time; "
        "needs gradient_accumulation_steps=1 and clip_grad_norm=null (set when turned on)",
    ),
    Control(
        "linear_ce",
        "linear cross-entropy",
        "bool",
        "never builds the [batch, seq, vocab] logits: less activation memory",
    ),
    Control(
        "compile", "compile", "bool", "speed option: faster steps after a one-off compile; memory unchanged"
    ),
    Control(
        "packing",
        "packing",
        "bool",
        "speed option: no pad tokens, same batch x max_seq_len tokens; memory unchanged",
    ),
)
# Short suffixes shown beside a label where the estimate does not move.
SPEED_ONLY = {"compile": "speed; memory same", "packing": "speed; memory same"}


def recipe_schema(recipe: str | None):
    """The `CONFIG_SCHEMA` of a built-in recipe (sft's for None), or None for a custom entry module."""
    import importlib

    try:
        module = importlib.import_module(f"engine.recipes.{recipe or 'sft'}")
    except ImportError:
        return None
    return getattr(module, "CONFIG_SCHEMA", None)


def unread_controls(recipe: str | None) -> dict[str, str]:
    """Controls the recipe does not read -> why, from its schema (the fields name the controls that
    apply; the schema says why the others do not). A custom recipe reads them all."""
    schema = recipe_schema(recipe)
    return schema.absent_controls() if schema is not None else {}


def control(name: str) -> Control:
    """The control with this name."""
    return next(c for c in CONTROLS if c.name == name)


def _as_yaml(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (bool, int, float, str, type(None))) else str(value)


def field_help(recipe: str | None, key: str) -> str:
    """The Recipe screen's line for a config key, from the recipe's schema: `key: doc · what it
    accepts (type, bounds) · default`. A component's argument (`optimizer.lr`) names its component;
    "" for a key the schema does not declare (or a custom recipe without a schema)."""
    schema = recipe_schema(recipe)
    if schema is None:
        return ""
    f = schema.field_at(key)
    if f is None:
        parts = key.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            parent = schema.field_at(".".join(parts[:cut]))
            if parent is not None:
                owner = ".".join(parts[:cut])
                return f"{key}: an argument of {owner} · {owner}: {parent.doc}"
        return ""
    default = "required" if f.required else f"default {_as_yaml(f.default)}"
    return f"{key}: {f.doc} · {f.wanted()} · {default}"


def control_help(recipe: str | None, name: str) -> str:
    """The line for a memory/parallel control: what it does, then the schema's line for the config
    key it sets (the field that names the control)."""
    c = control(name)
    schema = recipe_schema(recipe)
    key = next(
        (k for k, f in (schema.fields.items() if schema is not None else ()) if name in f.controls), None
    )
    line = field_help(recipe, key) if key is not None else ""
    return f"{c.label}: {c.effect}" + (f" · sets {line}" if line else "")


def absent_controls(cfg: dict, recipe: str | None) -> dict[str, str]:
    """Controls not offered for this config and recipe -> why (a custom recipe gets them all)."""
    out = unread_controls(recipe)
    if method_of(cfg) == "full":
        out.setdefault(
            "lora_rank", "full fine-tune trains every weight; pick a lora_*/qlora_* config for adapters"
        )
    return out


def dataset_sources(cfg: dict) -> list[str]:
    """Dotted paths of each dataset source node: `dataset`, `dataset.N` (a list) or
    `dataset.datasets.N` (an `engine.data.mix`)."""
    node = cfg.get("dataset")
    if isinstance(node, list):
        return [f"dataset.{i}" for i, n in enumerate(node) if isinstance(n, dict)]
    if isinstance(node, dict) and isinstance(node.get("datasets"), list):
        return [f"dataset.datasets.{i}" for i, n in enumerate(node["datasets"]) if isinstance(n, dict)]
    return ["dataset"] if isinstance(node, dict) else []


def _component(cfg: dict, key: str) -> str:
    node = cfg.get(key)
    return str(node.get("_component_", "")) if isinstance(node, dict) else ""


def optimizer_choice(cfg: dict) -> str:
    """The OPTIMIZERS key of the config's optimizer component, or AS_IN_CONFIG."""
    comp = _component(cfg, "optimizer")
    for key, (_, path) in OPTIMIZERS.items():
        if comp == path or comp.rsplit(".", 1)[-1].lower().replace("_", "") == key:
            return key
    return AS_IN_CONFIG


def uses_linear_ce(cfg: dict, recipe: str | None = "sft") -> bool:
    """True when the loss is linear cross-entropy (SFT's default when `loss` is missing)."""
    comp = _component(cfg, "loss")
    if not comp:
        return cfg.get("loss") is None and (recipe or "sft") == "sft"
    return comp.endswith("LinearCrossEntropyLoss")


def control_value(name: str, cfg: dict, recipe: str | None = None) -> Any:
    """The control's current value in `cfg` (bool, an OPTIMIZERS key or an int)."""
    if name == "activation_checkpointing":
        return bool(cfg.get("enable_activation_checkpointing", False))
    if name == "optimizer_in_bwd":
        return bool(cfg.get("optimizer_in_bwd", False))
    if name == "linear_ce":
        return uses_linear_ce(cfg, recipe)
    if name == "compile":
        return bool(cfg.get("compile", False))
    if name == "packing":
        sources = dataset_sources(cfg)
        return bool(sources) and all(bool(get_path(cfg, f"{s}").get("packed")) for s in sources)
    if name == "optimizer":
        return optimizer_choice(cfg)
    if name == "lora_rank":
        model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
        return model.get("lora_rank", 8)
    raise KeyError(name)


def _swap(base: dict, key: str, target: str) -> list[str]:
    """Overrides that make `key`'s component `target`: none when the base already uses it (its own
    arguments come back), a swap keeping accepted arguments, or a new node."""
    if _component(base, key) == target:
        return []
    if isinstance(base.get(key), dict) and "_component_" in base[key]:
        return [f"{key}={target}"]
    return [f"{key}={{_component_: {target}}}"]


def control_overrides(name: str, value: Any, base: dict, recipe: str | None = None) -> list[str]:
    """The `key=value` overrides that set control `name` to `value` on the loaded config `base`.

    Raises ValueError for a value the control cannot take (the message names the control)."""
    flag = "true" if value else "false"
    if name == "activation_checkpointing":
        return [f"enable_activation_checkpointing={flag}"]
    if name == "optimizer_in_bwd":
        if not value:
            return ["optimizer_in_bwd=false"]
        # The recipe refuses accumulation and clipping with it: every backward updates the weights.
        return ["optimizer_in_bwd=true", "gradient_accumulation_steps=1", "clip_grad_norm=null"]
    if name == "linear_ce":
        if bool(value) == uses_linear_ce(base, recipe):
            return []  # as loaded (SFT's default loss when `loss` is missing is linear CE)
        return _swap(base, "loss", LINEAR_CE if value else CHUNKED_CE)
    if name == "compile":
        return [f"compile={flag}"]
    if name == "packing":
        return [f"{s}.packed={flag}" for s in dataset_sources(base)]
    if name == "optimizer":
        if value == AS_IN_CONFIG:
            return []
        if value not in OPTIMIZERS:
            raise ValueError(f"optimizer: {value!r} is unknown; choose one of {', '.join(OPTIMIZERS)}")
        return _swap(base, "optimizer", OPTIMIZERS[value][1])
    if name == "lora_rank":
        text = str(value).strip()
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"LoRA rank: {text!r} is not a positive integer; use e.g. 8, 16 or 64")
        return [f"model.lora_rank={int(text)}"]
    raise KeyError(name)


def as_read_by(cfg: dict, recipe: str | None) -> dict:
    """A copy of `cfg` as `recipe` reads the memory options, for `training_options` with SFT's
    defaults: options the recipe does not read are dropped, a missing `loss` gets the recipe's
    default (linear CE for sft, logits-based losses otherwise)."""
    absent = unread_controls(recipe)
    out = dict(cfg)
    if "optimizer_in_bwd" in absent:
        out.pop("optimizer_in_bwd", None)
    if out.get("loss") is None:
        out["loss"] = {"_component_": LINEAR_CE if "linear_ce" not in absent else CHUNKED_CE}
    if "packing" in absent and isinstance(out.get("dataset"), dict):
        out["dataset"] = {k: v for k, v in out["dataset"].items() if k != "packed"}
    return out


def max_nproc(recipe: str | None, device_count: int) -> int:
    """The most processes the form offers: 1 for one-process recipes, else the GPUs here (or
    CPU_MAX_NPROC on a machine without GPUs)."""
    schema = recipe_schema(recipe)
    if schema is not None and schema.max_nproc is not None:
        return schema.max_nproc
    return device_count if device_count > 0 else CPU_MAX_NPROC


def parse_nproc(text: str, recipe: str | None, device_count: int) -> int:
    """The number of processes typed in the form. Raises ValueError naming the field and range."""
    top = max_nproc(recipe, device_count)
    raw = str(text).strip()
    if not raw.isdigit() or not 1 <= int(raw) <= top:
        why = unread_controls(recipe).get("nproc")
        where = f"({why})" if why else (f"({device_count} GPU(s) here)" if device_count else "(CPU ranks)")
        raise ValueError(f"processes: {raw or 'empty'} — use 1..{top} {where}")
    return int(raw)


def recipe_problems(cfg: dict, recipe: str | None, nproc: int = 1, device_count: int = 0) -> list[str]:
    """What the recipe would refuse at set-up, checked on every edit (the screen shows it at once):
    optimizer-in-backward with accumulation or clipping (also in `validate` for sft), packing without
    a pack length, a low-bit optimizer this machine cannot run, too many processes. One line each;
    [] when none."""
    from engine.config import ConfigError

    out: list[str] = []
    try:
        parse_nproc(str(nproc), recipe, device_count)
    except ValueError as exc:
        out.append(str(exc))
    if cfg.get("optimizer_in_bwd") and "optimizer_in_bwd" not in unread_controls(recipe):
        from engine.training.optimizer_in_backward import check_optimizer_in_backward_allowed

        try:
            check_optimizer_in_backward_allowed(
                gradient_accumulation_steps=int(cfg.get("gradient_accumulation_steps", 1)),
                clip_grad_norm=cfg.get("clip_grad_norm"),
            )
        except ConfigError as exc:
            out.append(str(exc))
    for src in dataset_sources(cfg):
        node = get_path(cfg, src)
        if node.get("packed") and not node.get("max_seq_len"):
            out.append(
                f"{src}.max_seq_len: packing needs the pack length — set it (e.g. 2048) or packed=false"
            )
    choice = optimizer_choice(cfg)
    if choice in ("adamw8bit", "adamw4bit"):
        from engine.training.low_bit_optimizers import check_low_bit_optimizer_supported

        device = str(cfg.get("device") or "auto")
        kind = "cuda" if device.startswith("cuda") or (device == "auto" and device_count > 0) else "cpu"
        try:
            check_low_bit_optimizer_supported(kind, name=OPTIMIZERS[choice][0].replace(" ", ""))
        except ConfigError as exc:
            out.append(str(exc))
    return out


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


# Config keys of the DeviceMesh degrees the estimate reads, and its TrainingOptions field for each
# (data_parallel_shard_dim is what the world size leaves; the estimate derives it).
MESH_DEGREES = (("data_parallel_replicate_dim", "dp_replicate"), ("context_parallel_dim", "cp"),
                ("tensor_parallel_dim", "tp"), ("expert_parallel_dim", "ep"))  # fmt: skip


def training_options(cfg: dict, nproc: int = 1, recipe: str | None = None) -> dict[str, Any]:
    """Keyword arguments for `engine.training.memory_estimate.TrainingOptions` read from a config.

    `recipe` (default: sft's defaults) decides what a missing `loss` means and whether the recipe
    reads the memory options at all (a DPO config's `optimizer_in_bwd` does nothing)."""
    absent = unread_controls(recipe)
    opt = str(_first(cfg, ("optimizer._component_",), "adamw")).lower()
    optimizer = (
        "adamw8bit" if "8bit" in opt else "adamw4bit" if "4bit" in opt else "sgd" if "sgd" in opt else "adamw"
    )
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    loss = cfg.get("loss") if isinstance(cfg.get("loss"), dict) else {}
    dtype = str(cfg.get("dtype") or "bf16")
    linear_ce = "linear_ce" not in absent and uses_linear_ce(cfg, recipe)
    every_k = cfg.get("ac_every_k", 1)
    out = dict(
        method=method_of(cfg),
        dtype=dtype if dtype in ("bf16", "fp16", "fp32", "float32", "bfloat16", "float16") else "bf16",
        batch_size=int(_first(cfg, ("batch_size", "dataset.batch_size"), 1) or 1),
        seq_len=int(
            _first(cfg, ("max_seq_len", "tokenizer.max_seq_len", "dataset.max_seq_len"), 2048) or 2048
        ),
        optimizer=optimizer,
        activation_checkpointing=bool(cfg.get("enable_activation_checkpointing", False)),
        ac_every_k=int(every_k) if isinstance(every_k, int) and every_k > 0 else 1,
        optimizer_in_backward="optimizer_in_bwd" not in absent and bool(cfg.get("optimizer_in_bwd", False)),
        linear_cross_entropy=linear_ce,
        compile=bool(cfg.get("compile", False)),
        packed=bool(control_value("packing", cfg)) and "packing" not in absent,
        nproc=1 if "nproc" in absent else max(1, int(nproc)),
    )
    for key, option in MESH_DEGREES:  # the DeviceMesh's degrees (the estimate checks they divide nproc)
        degree = cfg.get(key, 1)
        if isinstance(degree, int) and degree > 1 and out["nproc"] > 1:
            out[option] = degree
    if linear_ce and isinstance(loss.get("chunk_size"), int) and loss["chunk_size"] > 0:
        out["ce_chunk_tokens"] = loss["chunk_size"]
    if out["method"] != "full":
        rank = model.get("lora_rank")
        out["lora_rank"] = int(rank) if isinstance(rank, int) and rank > 0 else 8
        mods = model.get("lora_attn_modules") or ["q_proj", "v_proj"]
        out["lora_attn_modules"] = tuple(
            m for m in mods if m in ("q_proj", "k_proj", "v_proj", "output_proj", "o_proj")
        )
        out["lora_mlp"] = bool(model.get("apply_lora_to_mlp") or model.get("apply_lora_to_experts"))
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
