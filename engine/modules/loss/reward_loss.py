"""Bradley-Terry loss for reward models: `-log sigmoid(r_chosen - r_rejected - margin)`.

Ouyang et al. (2022) train the reward model on `log sigmoid(r(x, y_w) - r(x, y_l))`; Llama 2
(Touvron et al., 2023) subtracts a per-pair margin `m(r)` when annotators gave one, so clearly better
responses are pushed further apart.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ConfigError


class BradleyTerryLoss(nn.Module):
    """Per-pair loss on scalar rewards.

    Args:
        margin (float): a fixed margin subtracted from every difference (default 0).
        center_rewards_coeff (float): weight of `(r_c + r_r)^2`, which keeps rewards near zero
            (Eisenstein et al., 2023; default 0: off).
    Raises:
        ConfigError: a negative margin or coefficient.
    """

    def __init__(self, margin: float = 0.0, center_rewards_coeff: float = 0.0) -> None:
        super().__init__()
        if margin < 0 or center_rewards_coeff < 0:
            raise ConfigError("loss.margin / loss.center_rewards_coeff: must be >= 0", field="loss.margin")
        self.margin, self.center_rewards_coeff = float(margin), float(center_rewards_coeff)

    def forward(
        self,
        chosen_rewards: torch.Tensor,  # [B]
        rejected_rewards: torch.Tensor,  # [B]
        margins: torch.Tensor | None = None,  # [B] per-pair margins from the data, or None
    ) -> torch.Tensor:
        """`losses [B]`; `margins` (if given) are added to the fixed `margin`."""
        diff = chosen_rewards.float() - rejected_rewards.float() - self.margin
        if margins is not None:
            diff = diff - margins.float()
        losses = -F.logsigmoid(diff)
        if self.center_rewards_coeff:
            losses = (
                losses + self.center_rewards_coeff * (chosen_rewards.float() + rejected_rewards.float()) ** 2
            )
        return losses
