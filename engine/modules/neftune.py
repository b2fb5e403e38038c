"""NEFTune (Jain et al., 2023, "NEFTune: Noisy Embeddings Improve Instruction Finetuning").

While training, every input embedding gets uniform noise in `[-m, m]` with
`m = neftune_alpha / sqrt(S * D)` (S: the batch's sequence length, padding and packing included; D: the
embedding width), the scaling of the paper and of transformers' `neftune_post_forward_hook`. The noise is
drawn from torch's default generator, so a seeded run draws the same noise as transformers' hook at the
same seed. Evaluation and generation (`model.eval()`) see clean embeddings.
"""

from __future__ import annotations

import math

import torch


def neftune_magnitude(alpha: float, seq_len: int, dim: int) -> float:
    """The noise bound `alpha / sqrt(seq_len * dim)`."""
    return alpha / math.sqrt(seq_len * dim)


def add_neftune_noise(embeddings: torch.Tensor, alpha: float) -> torch.Tensor:
    """`embeddings [B,S,D]` plus uniform noise in `[-m, m]`, `m = neftune_magnitude(alpha, S, D)`."""
    _, s, d = embeddings.shape
    bound = neftune_magnitude(alpha, s, d)
    return embeddings + torch.empty_like(embeddings).uniform_(-bound, bound)


def set_neftune_alpha(model: torch.nn.Module, alpha: float) -> int:
    """Set NEFTune's alpha on every decoder in `model` (`TransformerDecoder.neftune_alpha`; 0 turns it
    off); returns how many decoders took it (0 for a model without one)."""
    decoders = [m for m in model.modules() if hasattr(m, "neftune_alpha")]
    for m in decoders:
        m.neftune_alpha = float(alpha)
    return len(decoders)
