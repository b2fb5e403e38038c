"""Config differences between runs, grouped and worded the way fine-tuning people talk about runs.

`config_diff(configs)` takes parsed configs (dicts) and returns, per group (model, data mix, recipe,
memory options, hyperparameters, other), the keys whose values differ, with each run's value made
readable (a `_component_` path becomes its last name, a dataset list becomes its source names).
"""

from __future__ import annotations

from typing import Any

GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("model", ("model", "checkpointer", "tokenizer", "base_model", "teacher", "ref_model", "dtype")),
    ("data mix", ("dataset", "data", "packed", "max_seq_len", "shuffle", "collate", "seed")),
    ("recipe", ("recipe", "method", "loss", "kd_ratio", "beta", "num_generations", "reward")),
    (
        "memory options",
        (
            "enable_activation_checkpointing",
            "activation_checkpointing",
            "enable_activation_offloading",
            "optimizer_in_bwd",
            "optimizer_in_backward",
            "compile",
            "linear_cross_entropy",
            "low_bit_optimizer",
            "fsdp",
            "nproc",
            "tensor_parallel",
        ),
    ),
    (
        "hyperparameters",
        (
            "optimizer",
            "lr_scheduler",
            "lr",
            "batch_size",
            "epochs",
            "max_steps",
            "max_steps_per_epoch",
            "gradient_accumulation_steps",
            "clip_grad_norm",
            "weight_decay",
            "warmup_steps",
        ),
    ),
)
IGNORED = ("output_dir", "metric_logger", "log_every_n_steps", "resume", "resume_from_checkpoint")


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}, "l": [{"x": 2}]}` -> `{"a.b": 1, "l.0.x": 2}`."""
    out: dict[str, Any] = {}
    if isinstance(node, dict):
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(node, list) and any(isinstance(v, (dict, list)) for v in node):
        for i, v in enumerate(node):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = node
    return out


def group_of(key: str) -> str:
    head = key.split(".", 1)[0]
    for group, heads in GROUPS:
        if head in heads or key in heads:
            return group
    if "lora" in key:
        return "recipe"
    return "other"


def readable(key: str, value: Any) -> str:
    """A value as a person would say it: component paths shortened, missing shown as `-`."""
    if value is None:
        return "-"
    if key.endswith("_component_") and isinstance(value, str):
        return value.rsplit(".", 1)[-1]
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def config_diff(configs: list[dict[str, Any]]) -> dict[str, list[tuple[str, list[str]]]]:
    """Per group, `(key, [value of run 0, value of run 1, ...])` for keys whose values differ.

    Groups with no difference are absent. Keys under `IGNORED` (paths, loggers) are skipped.
    """
    flat = [flatten(c or {}) for c in configs]
    keys = sorted(set().union(*flat)) if flat else []
    out: dict[str, list[tuple[str, list[str]]]] = {}
    for key in keys:
        if key.split(".", 1)[0] in IGNORED:
            continue
        values = [f.get(key) for f in flat]
        if all(v == values[0] for v in values[1:]):
            continue
        label = key[: -len("._component_")] if key.endswith("._component_") else key
        out.setdefault(group_of(key), []).append((label, [readable(key, v) for v in values]))
    order = [g for g, _ in GROUPS] + ["other"]
    return {g: out[g] for g in order if g in out}
