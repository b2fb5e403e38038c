"""The held-out split of recipes with a `validation` block: a seeded share of the training data
(`validation.fraction`) or a dataset of its own (`validation.dataset`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import Dataset, Subset

from engine.config import ConfigError


def holdout_split(dataset: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """`(train, held_out)`: `fraction` of the samples (at least one, at most all but one) held out,
    chosen by a permutation seeded from `seed`; both keep `source_names`.

    Raises:
        ConfigError: `validation.fraction` outside (0, 1), or a dataset too small to split.
    """
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"must be between 0 and 1, got {fraction}", field="validation.fraction")
    n = len(dataset)
    if n < 2:
        raise ConfigError(
            f"the dataset has {n} sample(s), too few to hold some out",
            hint="use more data or give validation.dataset",
            field="validation.fraction",
        )
    n_val = min(n - 1, max(1, int(round(n * fraction))))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 7919)).tolist()
    train, held_out = Subset(dataset, sorted(perm[n_val:])), Subset(dataset, sorted(perm[:n_val]))
    names = getattr(dataset, "source_names", None)
    if names:
        train.source_names = held_out.source_names = names
    return train, held_out


def validation_split(
    block: Mapping[str, Any], dataset: Dataset, tokenizer: Any, model: Any, seed: int
) -> tuple[Dataset, Dataset]:
    """`(train, held_out)` for a recipe's `validation` block (its defaults filled in by the schema):
    `validation.dataset` built with `tokenizer` and checked against the model's sequence length when
    given (the training data then stay whole), else `holdout_split(dataset, validation.fraction, seed)`.

    Raises:
        ConfigError: naming `validation.dataset` or `validation.fraction`.
    """
    if block["dataset"] is None:
        return holdout_split(dataset, float(block["fraction"]), seed)
    from engine.data import build_dataset
    from engine.training.model_setup import check_sequence_length

    held_out = build_dataset(block["dataset"], tokenizer)
    check_sequence_length(model, held_out, field="validation.dataset")
    return dataset, held_out
