"""GRPO: group-normalised advantages and the clipped policy-ratio loss with a k3 KL penalty.

A batch holds G completions of each prompt. Their rewards are normalised within the group, so a
completion is pushed up or down only relative to its siblings (no value network). The policy loss is
PPO's clipped surrogate per completion token; the KL to the reference policy uses Schulman's k3
estimator `exp(ref - logp) - (ref - logp) - 1` (unbiased, always >= 0).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ConfigError


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, scale_by_std: bool = True, eps: float = 1e-4
) -> torch.Tensor:
    """Advantages `[N*G]` from rewards `[N*G]` laid out group after group (rows g*G .. g*G+G-1).

    `A = (r - mean_group) / (std_group + eps)`, std unbiased (n-1); `scale_by_std=False` keeps only the
    centring (Dr. GRPO: no bias towards groups with small spread). A group whose rewards are all equal
    gets advantage 0 everywhere (it carries no signal).
    Raises ConfigError when the length is not a multiple of `group_size`.
    """
    if group_size < 1 or rewards.numel() % group_size:
        raise ConfigError(
            f"{rewards.numel()} rewards do not split into groups of {group_size}",
            field="group_size",
        )
    r = rewards.float().view(-1, group_size)  # [N, G]
    centred = r - r.mean(dim=1, keepdim=True)
    if scale_by_std and group_size > 1:
        std = r.std(dim=1, keepdim=True)  # [N,1]
        centred = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
    return centred.reshape(-1)


class GRPOLoss(nn.Module):
    """Clipped surrogate + `kl_coeff` * k3 KL, averaged over completion tokens.

    Args:
        epsilon (float): lower clip, ratio >= 1 - epsilon (default 0.2).
        epsilon_high (float | None): upper clip, ratio <= 1 + epsilon_high (default: epsilon; DAPO
            raises it, e.g. 0.28, to let rare tokens grow).
        kl_coeff (float): weight of the KL to the reference (default 0.04; 0 skips the reference pass).
        aggregation (str): "sequence" averages each completion's tokens, then the completions (GRPO
            paper; short completions weigh as much as long ones); "token" averages all tokens of the
            batch (DAPO; long completions weigh more).
    Raises:
        ConfigError: negative clip ranges or KL weight, unknown aggregation.
    """

    def __init__(
        self,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        kl_coeff: float = 0.04,
        aggregation: str = "sequence",
    ) -> None:
        super().__init__()
        if epsilon <= 0 or (epsilon_high is not None and epsilon_high <= 0):
            raise ConfigError("clip ranges must be > 0", field="loss.epsilon")
        if kl_coeff < 0:
            raise ConfigError(f"must be >= 0, got {kl_coeff}", field="loss.kl_coeff")
        if aggregation not in ("sequence", "token"):
            raise ConfigError(
                f"unknown {aggregation!r}", hint="use sequence or token", field="loss.aggregation"
            )
        self.epsilon = float(epsilon)
        self.epsilon_high = float(epsilon_high if epsilon_high is not None else epsilon)
        self.kl_coeff = float(kl_coeff)
        self.aggregation = aggregation

    def forward(
        self,
        logps: torch.Tensor,  # [B,T] log-probs of the completion tokens under the policy being trained
        old_logps: torch.Tensor,  # [B,T] the same under the policy that generated them (no grad)
        advantages: torch.Tensor,  # [B]
        mask: torch.Tensor,  # [B,T] bool, True on completion tokens
        ref_logps: torch.Tensor | None = None,  # [B,T] under the reference (needed when kl_coeff > 0)
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`(loss [], stats)`; stats (detached, token means): `kl`, `clip_fraction`, `ratio`."""
        m = mask.float()
        log_ratio = logps.float() - old_logps.float()
        ratio = torch.exp(log_ratio)  # [B,T]
        adv = advantages.float().unsqueeze(1)  # [B,1]
        clipped = ratio.clamp(1.0 - self.epsilon, 1.0 + self.epsilon_high)
        per_token = -torch.minimum(ratio * adv, clipped * adv)  # [B,T]
        kl = torch.zeros_like(per_token)
        if self.kl_coeff > 0:
            if ref_logps is None:
                raise ConfigError("> 0 needs reference log-probs", field="loss.kl_coeff")
            d = ref_logps.float() - logps.float()
            kl = torch.exp(d) - d - 1.0  # k3, [B,T]
            per_token = per_token + self.kl_coeff * kl
        if self.aggregation == "sequence":
            loss = ((per_token * m).sum(1) / m.sum(1).clamp(min=1)).mean()
        else:
            loss = (per_token * m).sum() / m.sum().clamp(min=1)
        n = m.sum().clamp(min=1)
        with torch.no_grad():
            # A token is clipped when the clamp, not the ratio, gave the minimum (its gradient is 0).
            was_clipped = ((ratio < 1.0 - self.epsilon) & (adv < 0)) | (
                (ratio > 1.0 + self.epsilon_high) & (adv > 0)
            )
            stats = {
                "kl": (kl * m).sum() / n,
                "clip_fraction": (was_clipped.float() * m).sum() / n,
                "ratio": (ratio * m).sum() / n,
            }
        return loss, stats
