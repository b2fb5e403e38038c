"""Cross-entropy on materialised logits, upcast to fp32 one sequence chunk at a time.

The reference loss for SFT when `[B, S, V]` logits are affordable, and the baseline that
`LinearCrossEntropyLoss` is checked against. Labels are already shifted (see docs/ARCHITECTURE.md):
`labels[b, i]` is the target of `logits[b, i]`, and `ignore_index` marks tokens outside the loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.config import ConfigError

REDUCTIONS = ("mean", "sum", "none")


def check_reduction(reduction: str, *, field: str = "loss.reduction") -> str:
    """Return `reduction` when it is one of `mean`, `sum`, `none`; raise `ConfigError` otherwise."""
    if reduction not in REDUCTIONS:
        raise ConfigError(
            f"unknown reduction {reduction!r}", hint=f"use one of {', '.join(REDUCTIONS)}", field=field
        )
    return reduction


class ChunkedCrossEntropyLoss(nn.Module):
    """Token-level cross-entropy whose fp32 upcast is done per sequence chunk.

    Upcasting bf16 logits `[B, S, V]` to fp32 at once doubles their memory; doing it per chunk
    keeps only `[B, S / num_output_chunks, V]` fp32 alive at a time (and the same in backward).

    Args:
        num_output_chunks (int): chunks along the sequence; default 8. 1 means no chunking.
        ignore_index (int): label value excluded from the loss; default -100.
        reduction (str): `mean` over non-ignored tokens (0 when every token is ignored), `sum`,
            or `none` (per-token losses `[B, S]`, 0 at ignored positions). Default `mean`.

    Raises:
        ConfigError: `num_output_chunks < 1` or an unknown reduction.
    """

    def __init__(self, num_output_chunks: int = 8, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        if int(num_output_chunks) < 1:
            raise ConfigError(
                f"must be >= 1, got {num_output_chunks}",
                hint="use 1 for no chunking",
                field="loss.num_output_chunks",
            )
        self.num_output_chunks = int(num_output_chunks)
        self.ignore_index = ignore_index
        self.reduction = check_reduction(reduction)

    def forward(self, logits: Tensor | list[Tensor], labels: Tensor) -> Tensor:
        """Loss of `logits` against `labels`.

        Args:
            logits: `[B, S, V]`, or a list of chunks `[B, S_i, V]` along the sequence (sum S_i = S).
            labels: `[B, S]` long, already shifted.

        Returns:
            A scalar for `mean`/`sum`; `[B, S]` fp32 for `none`.
        """
        if isinstance(logits, Tensor):
            chunks = list(logits.chunk(self.num_output_chunks, dim=1))  # each [B, S_i, V]
        else:
            chunks = list(logits)
        sizes = [c.shape[1] for c in chunks]
        label_chunks = labels.split(sizes, dim=1)  # each [B, S_i]

        per_chunk = []
        for logit_chunk, label_chunk in zip(chunks, label_chunks):
            vocab = logit_chunk.shape[-1]
            per_chunk.append(
                F.cross_entropy(
                    logit_chunk.reshape(-1, vocab).float(),  # [B * S_i, V] fp32
                    label_chunk.reshape(-1),
                    ignore_index=self.ignore_index,
                    reduction="none" if self.reduction == "none" else "sum",
                )
            )
        if self.reduction == "none":
            return torch.cat([p.view(labels.shape[0], -1) for p in per_chunk], dim=1)  # [B, S]
        total = torch.stack(per_chunk).sum()
        if self.reduction == "sum":
            return total
        count = (labels != self.ignore_index).sum().clamp(min=1)
        return total / count
