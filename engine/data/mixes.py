"""Several sources in one dataset: concatenation (a YAML list under ``dataset:``) and weighted mixes.

Every sample keeps a `source_id` that indexes the combined dataset's `source_names`, so a recipe can
report ``loss/<source_names[id]>``. Nesting works: ids of an inner combination are offset.

Weighted mix epochs: `mix(datasets, weights, num_samples)` serves `num_samples` samples per epoch
(default: the sum of the parts' lengths, i.e. as many as their concatenation). Source i gets
``round(num_samples * w_i / sum(w))`` of them (remainders go to the largest fractions), drawn
without replacement from a per-epoch permutation of that source, cycling through it again when it
is oversampled. `set_epoch(e)` changes the permutations and the interleaving; the same seed and
epoch give the same order on every rank.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from engine.data.data_errors import DataError


def _names(ds, index: int) -> list[str]:
    return list(getattr(ds, "source_names", None) or [f"source{index}"])


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        if n in seen:
            seen[n] += 1
            out.append(f"{n}_{seen[n]}")
        else:
            seen[n] = 0
            out.append(n)
    return out


class ConcatDataset(Dataset):
    """Parts one after another; `len` is the sum of the parts' lengths.

    Args:
      datasets: the parts (tokenized datasets, packs of the same length, other combinations).
      names: optional source names, one per part (default: each part's own names).
    """

    def __init__(self, datasets: list, names: list[str] | None = None):
        if not datasets:
            raise DataError("dataset: the list is empty; give at least one dataset")
        if names is not None and len(names) != len(datasets):
            raise DataError(f"names: {len(names)} names for {len(datasets)} datasets; give one per dataset")
        self.parts = list(datasets)
        self._offsets = [0]
        for d in self.parts:
            self._offsets.append(self._offsets[-1] + len(d))
        self._id_offset = []
        names_all: list[str] = []
        for k, d in enumerate(self.parts):
            self._id_offset.append(len(names_all))
            names_all += [names[k]] if names is not None and len(_names(d, k)) == 1 else _names(d, k)
        self.source_names = _unique(names_all)
        self.pad_id = getattr(self.parts[0], "pad_id", 0)
        # Packed and unpacked parts cannot share a batch: packs are fixed-length and carry document ids.
        sample_kinds = {getattr(d, "kind", "sft") for d in self.parts}
        if len(sample_kinds) > 1:
            raise DataError(
                f"dataset: parts hold different sample kinds ({', '.join(sorted(sample_kinds))}); a recipe batches "
                "one kind, so combine SFT, preference and prompt datasets only with their own kind"
            )
        self.kind = sample_kinds.pop()
        kinds = {
            (
                bool(getattr(d, "packed", False)),
                getattr(d, "max_seq_len", None) if getattr(d, "packed", False) else None,
            )
            for d in self.parts
        }
        if len(kinds) > 1:
            raise DataError(
                "dataset: parts mix packed and unpacked data (or packs of different max_seq_len); "
                "set the same packed and max_seq_len on every part"
            )
        self.packed, self.max_seq_len = next(iter(kinds))

    def __len__(self) -> int:
        return self._offsets[-1]

    @property
    def lengths(self) -> np.ndarray | None:
        """Token counts of all samples (None when a part does not report them)."""
        parts = [getattr(d, "lengths", None) for d in self.parts]
        if any(p is None for p in parts):
            return None
        return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        k = bisect_right(self._offsets, i) - 1
        sample = dict(self.parts[k][i - self._offsets[k]])
        return _relabel(sample, self._id_offset[k])


def _relabel(sample: dict[str, Any], offset: int) -> dict[str, Any]:
    if offset:
        if "source_ids" in sample:  # a pack: per-token ids, -1 on padding
            sample["source_ids"] = [s + offset if s >= 0 else s for s in sample["source_ids"]]
        sample["source_id"] = int(sample.get("source_id", 0)) + offset
    return sample


class WeightedMixDataset(Dataset):
    """Weighted sampling over parts; see the module docstring for the epoch definition."""

    def __init__(
        self,
        datasets: list,
        weights: list[float],
        num_samples: int | None = None,
        seed: int = 0,
        names: list[str] | None = None,
    ):
        if not datasets:
            raise DataError("mix: datasets is empty; give at least one dataset")
        if len(weights) != len(datasets):
            raise DataError(
                f"mix.weights: {len(weights)} weights for {len(datasets)} datasets; give one per dataset"
            )
        w = np.asarray(weights, dtype=np.float64)
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise DataError(f"mix.weights: {list(weights)} must be non-negative numbers with a positive sum")
        self._concat = ConcatDataset(datasets, names)
        self.parts = self._concat.parts
        self.source_names = self._concat.source_names
        self.pad_id = self._concat.pad_id
        self.packed, self.max_seq_len = self._concat.packed, self._concat.max_seq_len
        self.kind = self._concat.kind
        self.weights = (w / w.sum()).tolist()
        self.num_samples = int(num_samples) if num_samples is not None else len(self._concat)
        if self.num_samples <= 0:
            raise DataError(f"mix.num_samples: must be positive, got {num_samples!r}")
        self.seed = int(seed)
        exact = np.asarray(self.weights) * self.num_samples
        counts = np.floor(exact).astype(np.int64)
        for k in np.argsort(-(exact - counts))[: self.num_samples - int(counts.sum())]:
            counts[k] += 1
        self.counts = counts.tolist()
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Draw this epoch's order (deterministic in seed and epoch)."""
        rng = np.random.default_rng([self.seed, int(epoch)])
        index: list[tuple[int, int]] = []
        for k, (d, n) in enumerate(zip(self.parts, self.counts)):
            if n == 0:
                continue
            if len(d) == 0:
                raise DataError(
                    f"mix: dataset {k} ({self.source_names[k]}) is empty but has a positive weight"
                )
            reps = -(-n // len(d))
            order = np.concatenate([rng.permutation(len(d)) for _ in range(reps)])[:n]
            index += [(k, int(j)) for j in order]
        perm = rng.permutation(len(index))
        self._index = [index[p] for p in perm]
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.num_samples

    @property
    def lengths(self) -> np.ndarray | None:
        """Token counts of this epoch's samples (None when a part does not report them)."""
        parts = [getattr(d, "lengths", None) for d in self.parts]
        if any(p is None for p in parts):
            return None
        return np.array([int(parts[k][j]) for k, j in self._index], dtype=np.int64)

    def __getitem__(self, i: int) -> dict[str, Any]:
        k, j = self._index[i]
        return _relabel(dict(self.parts[k][j]), self._concat._id_offset[k])


def mix(
    tokenizer=None,
    *,
    datasets: list,
    weights: list[float],
    num_samples: int | None = None,
    seed: int = 0,
    names: list[str] | None = None,
    packed: bool = False,
    max_seq_len: int | None = None,
    split_across_pack: bool = False,
):
    """Weighted mix, usable from YAML::

        dataset:
          _component_: engine.data.mix
          weights: [3, 1]
          datasets:
            - {_component_: engine.data.instruct_dataset, source: ..., template: engine.data.AlpacaInstructTemplate}
            - {_component_: engine.data.gsm8k_dataset}

    `datasets` may be built datasets or `_component_` nodes (built here with `tokenizer`).
    Args: weights (one per dataset, any positive scale), num_samples per epoch (default: sum of
    lengths), seed, names (one per dataset, for ``loss/<name>``); packed / max_seq_len /
    split_across_pack pack the mixed stream (packs then hold documents of several sources; the
    epoch-0 order is packed once, `set_epoch` does not repack). Returns a `WeightedMixDataset`, or a
    `PackedDataset` over it when packed.
    """
    built = [_build_one(d, tokenizer, f"dataset.datasets.{k}") for k, d in enumerate(datasets)]
    ds = WeightedMixDataset(built, weights, num_samples=num_samples, seed=seed, names=names)
    if not packed:
        return ds
    if max_seq_len is None:
        raise DataError("dataset.max_seq_len: a packed mix needs max_seq_len (the length of each pack)")
    from engine.data.packing import PackedDataset

    return PackedDataset(ds, max_seq_len=max_seq_len, split_across_pack=split_across_pack)


def _is_mix(node: dict) -> bool:
    name = node.get("_component_")
    if not isinstance(name, str):
        return False
    from engine.config import import_component

    return import_component(name) is mix


def _build_one(node: Any, tokenizer, where: str):
    if isinstance(node, list):
        return ConcatDataset([_build_one(n, tokenizer, f"{where}.{k}") for k, n in enumerate(node)])
    if isinstance(node, dict):
        if "_component_" not in node:
            raise DataError(f"{where}: a dataset entry needs _component_ (e.g. engine.data.instruct_dataset)")
        if _is_mix(node):
            # Built here, not by instantiate: the inner dataset nodes need the tokenizer too.
            parts = node.get("datasets")
            if not isinstance(parts, list) or not parts:
                raise DataError(f"{where}.datasets: a mix needs a non-empty list of dataset nodes")
            extra = {k: v for k, v in node.items() if k not in ("_component_", "datasets")}
            allowed = (
                "weights",
                "num_samples",
                "seed",
                "names",
                "packed",
                "max_seq_len",
                "split_across_pack",
            )
            unknown = set(extra) - set(allowed)
            if unknown:
                raise DataError(
                    f"{where}: unknown mix argument(s) {sorted(unknown)}; use {', '.join(allowed)}"
                )
            if "weights" not in extra:
                raise DataError(f"{where}.weights: a mix needs one weight per dataset, e.g. weights: [3, 1]")
            built = [_build_one(d, tokenizer, f"{where}.datasets.{k}") for k, d in enumerate(parts)]
            return mix(datasets=built, **extra)
        from engine.config import instantiate

        return instantiate(node, tokenizer=tokenizer)
    if hasattr(node, "__getitem__") and hasattr(node, "__len__"):
        return node
    raise DataError(f"{where}: expected a dataset node with _component_, got {type(node).__name__}")


def build_dataset(cfg_dataset: Any, tokenizer) -> Dataset:
    """The dataset of a config's ``dataset:`` entry: one `_component_` node, or a list of them
    (a `ConcatDataset`, length = sum of parts, one source id per part), or an `engine.data.mix` node.

    Recipes call ``build_dataset(cfg["dataset"], tokenizer)``; use it rather than `instantiate` for
    mixes, whose inner nodes need the tokenizer as well. Raises `DataError`/`ConfigError`.
    """
    if cfg_dataset is None:
        raise DataError("dataset: missing; add a dataset node (e.g. _component_: engine.data.demo_dataset)")
    return _build_one(cfg_dataset, tokenizer, "dataset")
