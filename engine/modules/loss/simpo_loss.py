"""SimPO (Meng et al., 2024, "SimPO: Simple Preference Optimization with a Reference-Free Reward").

The implicit reward is the length-normalised log-likelihood `r(x, y) = beta / |y| * log pi(y|x)` and
`L = -log sigmoid(r(x, y_w) - r(x, y_l) - gamma)` with a target margin `gamma`. No reference model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ConfigError


class SimPOLoss(nn.Module):
    """Per-pair SimPO loss on summed response log-probs and response lengths (reference-free).

    Args:
        beta (float): reward scale (default 2.0; the paper uses 2.0-2.5).
        gamma (float): target reward margin (default 0.5; the paper searches 0.3-1.6).
        label_smoothing (float): 0 <= ls < 0.5, as in conservative DPO (default 0).
    Raises:
        ConfigError: beta <= 0, gamma < 0 or label smoothing out of range.
    """

    reference_free = True

    def __init__(self, beta: float = 2.0, gamma: float = 0.5, label_smoothing: float = 0.0) -> None:
        super().__init__()
        if not beta > 0:
            raise ConfigError(f"loss.beta: must be > 0, got {beta}", field="loss.beta")
        if gamma < 0:
            raise ConfigError(f"loss.gamma: must be >= 0, got {gamma}", field="loss.gamma")
        if not 0.0 <= label_smoothing < 0.5:
            raise ConfigError(
                f"loss.label_smoothing: must be in [0, 0.5), got {label_smoothing}",
                field="loss.label_smoothing",
            )
        self.beta, self.gamma, self.label_smoothing = float(beta), float(gamma), float(label_smoothing)

    def forward(
        self,
        chosen_logps: torch.Tensor,  # [B] summed response log-probs
        rejected_logps: torch.Tensor,  # [B]
        chosen_lengths: torch.Tensor,  # [B] response tokens
        rejected_lengths: torch.Tensor,  # [B]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(losses [B], chosen_rewards [B], rejected_rewards [B])`; rewards detached."""
        r_c = self.beta * chosen_logps.float() / chosen_lengths.float().clamp(min=1)
        r_r = self.beta * rejected_logps.float() / rejected_lengths.float().clamp(min=1)
        z = r_c - r_r - self.gamma
        ls = self.label_smoothing
        losses = -(1.0 - ls) * F.logsigmoid(z) - ls * F.logsigmoid(-z)
        return losses, r_c.detach(), r_r.detach()
