"""The resumable, world-size-invariant batch sampler every training recipe uses."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from engine.config import ConfigError


class EpochBatchSampler:
    """Batches of dataset indices for one rank, reproducible per `(seed, epoch)`, resumable mid-epoch.

    Every epoch draws one permutation of the whole dataset from `seed + epoch` (the same on every
    rank), cuts it to a multiple of `world_size * batch_size`, and gives rank `r` the indices
    `perm[r::world_size]` in batches of `batch_size`. So the global batch `k` (all ranks together)
    holds the same samples whatever the world size, which is what makes 1 rank with batch 4 and
    2 ranks with batch 2 the same training run. `skip` drops the first batches of the epoch (resume).

    Args:
        num_samples (int), batch_size (int, per rank), world_size (int), rank (int), seed (int),
        shuffle (bool; default True).
    Raises:
        ConfigError: the dataset is smaller than one global batch.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        batch_size: int,
        world_size: int = 1,
        rank: int = 0,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        global_batch = batch_size * world_size
        if num_samples < global_batch:
            raise ConfigError(
                f"the dataset has {num_samples} samples, fewer than one global batch "
                f"({batch_size} x {world_size} ranks)",
                hint="lower batch_size or use more data",
                field="batch_size",
            )
        self.num_samples, self.batch_size = num_samples, batch_size
        self.world_size, self.rank, self.seed, self.shuffle = world_size, rank, seed, shuffle
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int, *, skip: int = 0) -> None:
        """Select the epoch's permutation and how many of its batches were already consumed."""
        self.epoch, self.skip = epoch, skip

    def __len__(self) -> int:
        """Batches per epoch for this rank (before `skip`)."""
        return self.num_samples // (self.batch_size * self.world_size)

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed + self.epoch)
            perm = torch.randperm(self.num_samples, generator=gen)
        else:
            perm = torch.arange(self.num_samples)
        usable = len(self) * self.batch_size * self.world_size
        mine = perm[:usable][self.rank :: self.world_size].tolist()
        for b in range(self.skip, len(self)):
            yield mine[b * self.batch_size : (b + 1) * self.batch_size]
