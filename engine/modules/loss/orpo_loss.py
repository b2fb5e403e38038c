"""ORPO (Hong et al., 2024, "ORPO: Monolithic Preference Optimization without Reference Model").

`L = L_SFT + lambda * L_OR`, with `L_OR = -log sigmoid(log(odds(y_w|x) / odds(y_l|x)))`,
`odds(y|x) = P(y|x) / (1 - P(y|x))` and `P(y|x) = exp(mean_t log p(y_t | x, y_<t))` (the paper's
length-normalised likelihood). `L_SFT` is the chosen response's negative log-likelihood, averaged
over its tokens. No reference model.

The NLL term differs from TRL's `ORPOTrainer` in how tokens are weighted: here each pair's `L_SFT` is
the mean over that pair's own response tokens, and the batch loss is the mean over pairs (every pair
counts the same, short or long); TRL (1.16, `trl.experimental.orpo`, decoder-only models) takes one
token mean over every non-padding token of the batch's chosen sequences, prompt tokens included (a
long sequence counts more, and the prompt is trained on too). The odds-ratio term is per pair in both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ConfigError


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """`log(1 - exp(x))` for `x < 0`, stable at both ends (Maechler, 2012)."""
    return torch.where(x > -0.6931471805599453, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


class ORPOLoss(nn.Module):
    """Per-pair ORPO loss on summed response log-probs and response lengths (reference-free).

    Args:
        beta (float): `lambda`, the weight of the odds-ratio term (default 0.1, the paper's choice).
    Raises:
        ConfigError: beta <= 0.
    """

    reference_free = True

    def __init__(self, beta: float = 0.1) -> None:
        super().__init__()
        if not beta > 0:
            raise ConfigError(f"loss.beta: must be > 0, got {beta}", field="loss.beta")
        self.beta = float(beta)

    def forward(
        self,
        chosen_logps: torch.Tensor,  # [B] summed response log-probs
        rejected_logps: torch.Tensor,  # [B]
        chosen_lengths: torch.Tensor,  # [B] response tokens
        rejected_lengths: torch.Tensor,  # [B]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(losses [B], chosen_rewards [B], rejected_rewards [B])`; rewards `beta * mean log p`, detached."""
        avg_c = chosen_logps.float() / chosen_lengths.float().clamp(min=1)
        avg_r = rejected_logps.float() / rejected_lengths.float().clamp(min=1)
        # log odds(y) = log P - log(1 - P); clamp keeps P < 1 (a response of certain tokens has no odds)
        avg_c, avg_r = avg_c.clamp(max=-1e-6), avg_r.clamp(max=-1e-6)
        log_odds_ratio = (avg_c - log1mexp(avg_c)) - (avg_r - log1mexp(avg_r))
        losses = -avg_c - self.beta * F.logsigmoid(log_odds_ratio)
        return losses, (self.beta * avg_c).detach(), (self.beta * avg_r).detach()
