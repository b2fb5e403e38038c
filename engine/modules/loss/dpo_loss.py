"""Direct preference optimisation losses on sequence log-probabilities: sigmoid (DPO), IPO, hinge.

The recipe computes, for every preference pair, the summed log-probability of the chosen and of the
rejected response under the policy and under the frozen reference; this module turns those four `[B]`
vectors into a per-pair loss and the implicit rewards `beta * (log pi - log pi_ref)`. IPO's
length-normalised form (TRL's) also takes the response lengths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ConfigError

DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge")


class DPOLoss(nn.Module):
    """Per-pair preference loss.

    With `h = (logp_c - logp_r) - (ref_c - ref_r)` (the policy's log-ratio margin over the reference's,
    each log-prob summed over the response's tokens):
    - `sigmoid` (DPO): `-(1 - ls) * logsigmoid(beta * h) - ls * logsigmoid(-beta * h)`
      (`ls` = `label_smoothing`, the conservative-DPO assumption that a fraction of labels is flipped);
    - `ipo` (Azar et al. 2023, eq. 17): `(h_ipo - 1 / (2 * beta))^2`, which regresses the margin to a
      fixed target and does not saturate. With `ipo_normalize: true` (the default) each log-ratio is
      divided by its response's token count first, as TRL's `loss_type="ipo"` does (the form the IPO
      authors' results use):
      `h_ipo = (logp_c - ref_c) / |y_c| - (logp_r - ref_r) / |y_r|`, so a beta taken from a TRL
      config means the same here. With `ipo_normalize: false`, `h_ipo = h` on the summed log-probs
      (this project's form before the option existed; the squared error then grows with response
      length, and a beta from TRL means something else);
    - `hinge`: `relu(1 - beta * h)` (SLiC; stops pushing once the margin passes 1/beta).

    Args:
        beta (float): strength of the KL anchor to the reference (default 0.1; larger stays closer).
        label_smoothing (float): 0 <= ls < 0.5, sigmoid loss only (default 0).
        loss_type (str): "sigmoid" | "ipo" | "hinge".
        ipo_normalize (bool): IPO on per-token (length-normalised) log-ratios, as TRL (default True);
            False: on summed log-probs. Only IPO reads it.
    Raises:
        ConfigError: unknown loss type, beta <= 0, label smoothing out of range or used with ipo/hinge.
    """

    def __init__(
        self,
        beta: float = 0.1,
        label_smoothing: float = 0.0,
        loss_type: str = "sigmoid",
        ipo_normalize: bool = True,
    ) -> None:
        super().__init__()
        if loss_type not in DPO_LOSS_TYPES:
            raise ConfigError(
                f"unknown {loss_type!r}",
                hint=f"use one of {', '.join(DPO_LOSS_TYPES)}",
                field="loss.loss_type",
            )
        if not beta > 0:
            raise ConfigError(f"must be > 0, got {beta}", field="loss.beta")
        if not 0.0 <= label_smoothing < 0.5:
            raise ConfigError(
                f"must be in [0, 0.5), got {label_smoothing}",
                field="loss.label_smoothing",
            )
        if label_smoothing and loss_type != "sigmoid":
            raise ConfigError(
                "only the sigmoid loss uses it",
                hint=f"set it to 0 for {loss_type}",
                field="loss.label_smoothing",
            )
        if not isinstance(ipo_normalize, bool):
            raise ConfigError(f"must be true or false, got {ipo_normalize!r}", field="loss.ipo_normalize")
        self.beta = float(beta)
        self.label_smoothing = float(label_smoothing)
        self.loss_type = loss_type
        self.ipo_normalize = ipo_normalize

    def forward(
        self,
        policy_chosen_logps: torch.Tensor,  # [B] summed log-probs of the chosen responses
        policy_rejected_logps: torch.Tensor,  # [B]
        reference_chosen_logps: torch.Tensor,  # [B] (no grad)
        reference_rejected_logps: torch.Tensor,  # [B] (no grad)
        chosen_lengths: torch.Tensor | None = None,  # [B] response tokens (normalised IPO)
        rejected_lengths: torch.Tensor | None = None,  # [B]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(losses [B], chosen_rewards [B], rejected_rewards [B])`; rewards are detached.

        Raises:
            ValueError: normalised IPO without `chosen_lengths` / `rejected_lengths`.
        """
        pi = policy_chosen_logps.float() - policy_rejected_logps.float()
        ref = reference_chosen_logps.float() - reference_rejected_logps.float()
        h = pi - ref  # [B]
        if self.loss_type == "sigmoid":
            ls = self.label_smoothing
            losses = -(1.0 - ls) * F.logsigmoid(self.beta * h) - ls * F.logsigmoid(-self.beta * h)
        elif self.loss_type == "ipo":
            if self.ipo_normalize:
                if chosen_lengths is None or rejected_lengths is None:
                    raise ValueError("normalised IPO needs chosen_lengths and rejected_lengths")
                ratio_c = policy_chosen_logps.float() - reference_chosen_logps.float()
                ratio_r = policy_rejected_logps.float() - reference_rejected_logps.float()
                h = ratio_c / chosen_lengths.float().clamp(min=1) - ratio_r / rejected_lengths.float().clamp(
                    min=1
                )
            losses = (h - 1.0 / (2.0 * self.beta)) ** 2
        else:
            losses = torch.relu(1.0 - self.beta * h)
        chosen_rewards = self.beta * (policy_chosen_logps.float() - reference_chosen_logps.float()).detach()
        rejected_rewards = (
            self.beta * (policy_rejected_logps.float() - reference_rejected_logps.float()).detach()
        )
        return losses, chosen_rewards, rejected_rewards
