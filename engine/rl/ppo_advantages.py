"""PPO's reward shaping and advantage estimation on response tokens, and the KL coefficient controllers.

Tensors are `[B,T]` over the response tokens of B rollouts (T = longest response), with `mask [B,T]`
True on real tokens. Index `t` is the action "emit response token t"; `values[b, t]` is the value
model's estimate before emitting it (read at the position that predicts token t).
"""

from __future__ import annotations

import math

import torch

from engine.config import ConfigError


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over the True entries of `mask` (all of them, or along `dim`); 0 when there are none."""
    m = mask.to(x.dtype)
    if dim is None:
        return (x * m).sum() / m.sum().clamp(min=1)
    return (x * m).sum(dim) / m.sum(dim).clamp(min=1)


def whiten(
    x: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """`(x - mean) / std` over the masked entries (population variance); `shift_mean=False` only scales,
    keeping the mean (for rewards, whose sign carries meaning). Masked-out entries come back as 0."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask.to(x.dtype)


def kl_penalised_rewards(
    scores: torch.Tensor,  # [B] sequence reward (reward model or verifiable rewards)
    logps: torch.Tensor,  # [B,T] response-token log-probs under the rollout policy
    ref_logps: torch.Tensor,  # [B,T] under the reference
    mask: torch.Tensor,  # [B,T] bool
    kl_coeff: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards `r_t = -kl_coeff * (logp_t - ref_t)`, plus `scores` on each row's last token.

    Returns `(rewards [B,T], kl [B,T])` with `kl = logp - ref` (the k1 estimator, 0 off the mask).
    This is the shaping of Ziegler et al. (2019) / Stiennon et al. (2020): the reference KL is paid
    token by token and the sequence reward arrives at the end.
    """
    m = mask.to(torch.float32)
    kl = (logps.float() - ref_logps.float()) * m
    rewards = -kl_coeff * kl
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = (positions * mask.long()).argmax(1)  # each row's last response token (mask need not start at 0)
    rows = torch.arange(scores.shape[0], device=scores.device)
    has_tokens = mask.any(1).to(torch.float32)
    rewards[rows, last] += scores.float() * has_tokens
    return rewards, kl


def mean_sequence_kl(kl: torch.Tensor) -> float:
    """The batch's KL to the reference in the controller's units: nats per sequence, i.e. each row's
    per-token KL `kl [B,T]` (0 off the mask, as `kl_penalised_rewards` returns it) summed over its
    tokens, then the mean over the B rows (Ziegler et al.'s `mean(sum(logp - ref, axis=1))`)."""
    return float(kl.sum(dim=1).mean())


def gae(
    rewards: torch.Tensor,  # [B,T]
    values: torch.Tensor,  # [B,T]
    mask: torch.Tensor,  # [B,T] bool; each row's True entries are one contiguous run
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al., 2016): `(advantages [B,T], returns [B,T])`.

    `delta_t = r_t + gamma * V_{t+1} - V_t` with `V_{t+1} = 0` after a row's last token (the episode
    ends there), `A_t = delta_t + gamma * lam * A_{t+1}`, and `returns = A + V`, the value target.
    Entries off the mask are 0.
    """
    m = mask.to(torch.float32)
    r, v = rewards.float() * m, values.float() * m
    T = r.shape[1]
    adv = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in reversed(range(T)):
        next_value = v[:, t + 1] if t + 1 < T else torch.zeros_like(running)
        next_value = next_value * (m[:, t + 1] if t + 1 < T else 0.0)
        delta = r[:, t] + gamma * next_value - v[:, t]
        running = (delta + gamma * lam * running) * m[:, t]
        adv[:, t] = running
    return adv, (adv + v) * m


class FixedKLController:
    """A constant KL coefficient `value` (no target)."""

    def __init__(self, value: float) -> None:
        if value < 0:
            raise ConfigError(f"kl_coeff: must be >= 0, got {value}", field="kl_coeff")
        self.value = float(value)
        self.target = None

    def update(self, current_kl: float, n_steps: int) -> float:  # noqa: ARG002 - same interface
        return self.value


class AdaptiveKLController:
    """Ziegler et al. (2019), eq. 2: steer the per-sequence KL to `target`.

    After a batch of `n_steps` rollouts with mean sequence KL `k` (`mean_sequence_kl`):
    `e = clip(k / target - 1, -0.2, 0.2)` and `beta <- beta * (1 + e * n_steps / horizon)`; too much KL
    raises the coefficient, too little lowers it. `n_steps / horizon` is the gain per update (their
    K_beta = 0.1; their code: 512-rollout batches, horizon 10000, ~0.05): a horizon shorter than one
    batch moves beta by more than 20% per update, so while a fresh policy's KL is still under target
    (it starts at 0) beta collapses, and the KL then overshoots for as many updates as beta needs to
    climb back (PPO's config check refuses `kl_horizon < batch_size * num_samples`).
    """

    def __init__(self, value: float, target: float, horizon: int = 10000) -> None:
        if value <= 0 or target <= 0 or horizon < 1:
            raise ConfigError(
                f"kl: init_kl_coeff ({value}) and kl_target ({target}) must be > 0 and kl_horizon ({horizon}) >= 1",
                field="kl_target",
            )
        self.value, self.target, self.horizon = float(value), float(target), int(horizon)

    def update(self, current_kl: float, n_steps: int) -> float:
        if math.isfinite(current_kl):
            error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
            self.value *= 1.0 + error * n_steps / self.horizon
        return self.value
