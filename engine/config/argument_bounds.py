"""Bounds on component arguments whose name means the same in every component that takes it.

A type check (`engine.config._types.accepts`) lets `lr: -1` or `lora_rank: 0` through: both are the
right type, and only the component itself refuses them when a run builds it (torch's "Invalid
learning rate", the builder's "lora_rank: must be a positive integer"), after the run was registered
or queued. `validate` checks these bounds up front, so `tunebench validate`, a launched run, a queued
run and every run of a sweep refuse them before anything is written.

Only names with one meaning across the project's components and the optimizers its configs name are
listed; a value that is not a number (a type problem, or an unresolved `${...}`) is left to the type
check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.config._errors import ConfigProblem

# name -> (is the value fine, what is wrong, what to change)
_POSITIVE_INT = (
    lambda v: not isinstance(v, int) or v >= 1,  # a float is the type check's to report
    "must be a positive integer",
    "set it to 1 or more",
)
_NON_NEGATIVE = (lambda v: v >= 0, "must be 0 or more", "give a value >= 0")
_PROBABILITY = (lambda v: 0 <= v <= 1, "must be between 0 and 1", "give a probability such as 0.0 or 0.1")

BOUNDS: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    # model sizes: every decoder builder refuses anything but a positive integer
    **{
        name: _POSITIVE_INT
        for name in (
            "vocab_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "embed_dim",
            "intermediate_dim",
            "max_seq_len",
            "head_dim",
            "lora_rank",
        )
    },  # fmt: skip
    # optimizers (torch.optim and the low-bit ones): a negative value raises when they are built
    "lr": (lambda v: v >= 0, "must be 0 or more", "a learning rate is positive, e.g. 1e-4"),
    "weight_decay": _NON_NEGATIVE,
    "eps": _NON_NEGATIVE,
    # dropout probabilities (LoRA adapters, attention)
    "lora_dropout": _PROBABILITY,
    "attn_dropout": _PROBABILITY,
}


def bound_problem(field: str, name: str, value: Any) -> ConfigProblem | None:
    """The problem with argument `name` = `value` at `field`, or None (fine, not a number, or a
    name without a bound here)."""
    rule = BOUNDS.get(name)
    if rule is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    ok, what, hint = rule
    if ok(value):
        return None
    return ConfigProblem(field, f"{what}, got {value!r}", hint)
