"""A seeded held-out split of a dataset (validation for recipes that take `validation.fraction`)."""

from __future__ import annotations

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
