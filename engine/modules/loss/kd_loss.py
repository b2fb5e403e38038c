"""Knowledge distillation loss: KL between teacher and student token distributions, mixed with CE.

Both models' final hidden states are projected to the vocabulary a chunk of tokens at a time, and each
chunk's forward is recomputed in backward (activation checkpointing), so no `[B,S,V]` logits of either
model are ever held whole: the peak is one `[chunk, V]` block per model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from engine.config import ConfigError

KD_KINDS = ("forward", "reverse", "symmetric")


def _chunk_losses(
    s_hidden: torch.Tensor,  # [N,D] student hidden states of kept tokens
    s_weight: torch.Tensor,  # [V,D]
    t_hidden: torch.Tensor,  # [N,Dt] teacher's, no grad
    t_weight: torch.Tensor,  # [V,Dt]
    labels: torch.Tensor,  # [N]
    kind: str,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(kd sum [], ce sum [])` over the N tokens of one chunk, fp32."""
    s_logits = (s_hidden @ s_weight.t()).float()  # [N,V]
    t_logits = (t_hidden @ t_weight.t()).float()  # [N,V]
    ce = F.cross_entropy(s_logits, labels, reduction="sum")
    s_logp = F.log_softmax(s_logits / temperature, dim=-1)
    t_logp = F.log_softmax(t_logits / temperature, dim=-1)
    fwd = rev = None
    if kind in ("forward", "symmetric"):  # KL(teacher || student): mass-covering
        fwd = (t_logp.exp() * (t_logp - s_logp)).sum()
    if kind in ("reverse", "symmetric"):  # KL(student || teacher): mode-seeking
        rev = (s_logp.exp() * (s_logp - t_logp)).sum()
    kd = fwd if kind == "forward" else rev if kind == "reverse" else 0.5 * (fwd + rev)
    return kd * temperature**2, ce


class KDLoss(nn.Module):
    """`loss = (1 - kd_ratio) * CE(student, labels) + kd_ratio * KL`, token means over labelled tokens.

    Args:
        kind (str): "forward" KL(teacher||student) (default), "reverse" KL(student||teacher), or
            "symmetric" (their average).
        kd_ratio (float): weight of the KL term in [0, 1] (default 0.5).
        temperature (float): softens both distributions; the KL is scaled by T^2 (default 1).
        chunk_size (int): tokens projected at once (default 1024).
        ignore_index (int): label of tokens outside the loss (default -100).
    Raises:
        ConfigError: unknown kind, ratio outside [0, 1], non-positive temperature or chunk size.
    Call: `loss_fn(s_hidden [B,S,D], s_weight [V,D], t_hidden [B,S,Dt], t_weight [V,Dt], labels [B,S])`
    -> `(loss, kd, ce)`, each a 0-dim fp32 tensor (kd and ce detached). All-ignored batches give 0.
    """

    def __init__(
        self,
        kind: str = "forward",
        kd_ratio: float = 0.5,
        temperature: float = 1.0,
        chunk_size: int = 1024,
        ignore_index: int = -100,
    ) -> None:
        super().__init__()
        if kind not in KD_KINDS:
            raise ConfigError(
                f"unknown {kind!r}", hint=f"use one of {', '.join(KD_KINDS)}", field="loss.kind"
            )
        if not 0.0 <= kd_ratio <= 1.0:
            raise ConfigError(f"must be in [0, 1], got {kd_ratio}", field="loss.kd_ratio")
        if temperature <= 0:
            raise ConfigError(f"must be > 0, got {temperature}", field="loss.temperature")
        if chunk_size < 1:
            raise ConfigError(f"must be >= 1, got {chunk_size}", field="loss.chunk_size")
        self.kind = kind
        self.kd_ratio = float(kd_ratio)
        self.temperature = float(temperature)
        self.chunk_size = int(chunk_size)
        self.ignore_index = ignore_index

    def forward(
        self,
        student_hidden: torch.Tensor,
        student_weight: torch.Tensor,
        teacher_hidden: torch.Tensor,
        teacher_weight: torch.Tensor,
        labels: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keep = (labels != self.ignore_index).reshape(-1)  # [B*S]
        s = student_hidden.reshape(-1, student_hidden.shape[-1])[keep]  # [N,D]
        t = teacher_hidden.detach().reshape(-1, teacher_hidden.shape[-1])[keep]  # [N,Dt]
        y = labels.reshape(-1)[keep]  # [N]
        n = y.numel()
        kd_sum = student_hidden.new_zeros((), dtype=torch.float32)
        ce_sum = student_hidden.new_zeros((), dtype=torch.float32)
        tw = teacher_weight.detach()
        for start in range(0, n, self.chunk_size):
            sl = slice(start, start + self.chunk_size)
            kd_c, ce_c = checkpoint(
                _chunk_losses, s[sl], student_weight, t[sl], tw, y[sl], self.kind, self.temperature,
                use_reentrant=False,
            )  # fmt: skip
            kd_sum = kd_sum + kd_c
            ce_sum = ce_sum + ce_c
        denom = max(n, 1)
        kd, ce = kd_sum / denom, ce_sum / denom
        loss = (1.0 - self.kd_ratio) * ce + self.kd_ratio * kd
        return loss, kd.detach(), ce.detach()
