"""PPO's clipped policy surrogate and clipped value loss (Schulman et al., 2017), on response tokens.

Inputs are `[B,T]` over the response tokens of a minibatch of rollouts, `mask [B,T]` True on real
tokens. Advantages and returns come from `engine.rl.ppo_advantages.gae` at rollout time (no grad).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ConfigError


def _mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return (x * m).sum() / m.sum().clamp(min=1)


class PPOLoss(nn.Module):
    """`policy_loss + value_coeff * value_loss`, each a token mean over the mask.

    - policy: `max(-A * rho, -A * clip(rho, 1 - epsilon, 1 + epsilon))`, `rho = exp(logp - old_logp)`;
    - value: `0.5 * max((V - R)^2, (V_clip - R)^2)` with `V_clip = V_old + clip(V - V_old, -value_clip,
      value_clip)` (value_clip null: the plain squared error).

    Args:
        epsilon (float): policy ratio clip (default 0.2).
        value_clip (float | None): how far a value may move from its rollout estimate (default 0.2).
        value_coeff (float): weight of the value loss (default 0.1).
    Raises:
        ConfigError: a clip range or coefficient that is not positive.
    """

    def __init__(
        self, epsilon: float = 0.2, value_clip: float | None = 0.2, value_coeff: float = 0.1
    ) -> None:
        super().__init__()
        if not epsilon > 0:
            raise ConfigError(f"loss.epsilon: must be > 0, got {epsilon}", field="loss.epsilon")
        if value_clip is not None and not value_clip > 0:
            raise ConfigError(
                f"loss.value_clip: must be > 0 or null, got {value_clip}", field="loss.value_clip"
            )
        if not value_coeff > 0:
            raise ConfigError(f"loss.value_coeff: must be > 0, got {value_coeff}", field="loss.value_coeff")
        self.epsilon = float(epsilon)
        self.value_clip = None if value_clip is None else float(value_clip)
        self.value_coeff = float(value_coeff)

    def forward(
        self,
        logps: torch.Tensor,  # [B,T] under the policy being trained
        old_logps: torch.Tensor,  # [B,T] under the rollout policy (no grad)
        advantages: torch.Tensor,  # [B,T]
        values: torch.Tensor,  # [B,T] value model now
        old_values: torch.Tensor,  # [B,T] value model at rollout time (no grad)
        returns: torch.Tensor,  # [B,T] value targets
        mask: torch.Tensor,  # [B,T] bool
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """`(loss [], stats)`; stats (detached token means): `policy_loss`, `value_loss`,
        `clip_fraction`, `value_clip_fraction`, `approx_kl` (k3: `rho - 1 - log rho`), `ratio`."""
        m = mask.float()
        log_ratio = logps.float() - old_logps.float()
        ratio = torch.exp(log_ratio)
        adv = advantages.float()
        pg_plain = -adv * ratio
        pg_clipped = -adv * ratio.clamp(1.0 - self.epsilon, 1.0 + self.epsilon)
        policy_loss = _mean(torch.maximum(pg_plain, pg_clipped), m)
        v, v_old, ret = values.float(), old_values.float(), returns.float()
        err = (v - ret) ** 2
        if self.value_clip is None:
            value_loss = 0.5 * _mean(err, m)
            value_clipped = torch.zeros_like(err)
        else:
            v_clip = v_old + (v - v_old).clamp(-self.value_clip, self.value_clip)
            err_clip = (v_clip - ret) ** 2
            value_loss = 0.5 * _mean(torch.maximum(err, err_clip), m)
            value_clipped = (err_clip > err).float()
        loss = policy_loss + self.value_coeff * value_loss
        with torch.no_grad():
            stats = {
                "policy_loss": policy_loss.detach(),
                "value_loss": value_loss.detach(),
                "clip_fraction": _mean((pg_clipped > pg_plain).float(), m),
                "value_clip_fraction": _mean(value_clipped, m),
                "approx_kl": _mean(ratio - 1.0 - log_ratio, m),
                "ratio": _mean(ratio, m),
            }
        return loss, stats
