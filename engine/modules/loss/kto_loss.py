"""KTO (Ethayarajh et al., 2024, "KTO: Model Alignment as Prospect Theoretic Optimization").

Works on unpaired examples, each desirable or undesirable. With the implied reward
`r(x, y) = log pi(y|x) - log pi_ref(y|x)` and the reference point `z0 = max(0, KL(pi || pi_ref))`:

    v(x, y) = lambda_D * sigmoid(beta * (r - z0))   if y is desirable
              lambda_U * sigmoid(beta * (z0 - r))   if y is undesirable
    L = E[lambda_y - v(x, y)]

`z0` is estimated, as in the paper, from mismatched pairs `(x, y')` of the same micro-batch (each
prompt with another example's completion): the mean of `log pi(y'|x) - log pi_ref(y'|x)`, clamped at 0
and not back-propagated.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ConfigError


class KTOLoss(nn.Module):
    """Per-example KTO loss.

    Args:
        beta (float): reward scale (default 0.1).
        desirable_weight (float): `lambda_D` (default 1.0). undesirable_weight (float): `lambda_U`
            (default 1.0). The paper advises `lambda_D * n_D / (lambda_U * n_U)` in [1, 4/3].
    Raises:
        ConfigError: a non-positive beta or weight.
    """

    reference_free = False

    def __init__(
        self, beta: float = 0.1, desirable_weight: float = 1.0, undesirable_weight: float = 1.0
    ) -> None:
        super().__init__()
        for name, value in (("beta", beta), ("desirable_weight", desirable_weight),
                            ("undesirable_weight", undesirable_weight)):  # fmt: skip
            if not value > 0:
                raise ConfigError(f"loss.{name}: must be > 0, got {value}", field=f"loss.{name}")
        self.beta = float(beta)
        self.desirable_weight, self.undesirable_weight = float(desirable_weight), float(undesirable_weight)

    def forward(
        self,
        policy_logps: torch.Tensor,  # [N] summed completion log-probs
        reference_logps: torch.Tensor,  # [N] (no grad)
        desirable: torch.Tensor,  # [N] bool
        kl_policy_logps: torch.Tensor,  # [M] mismatched pairs under the policy
        kl_reference_logps: torch.Tensor,  # [M] ... and the reference
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(losses [N], rewards [N] detached, z0 [])`."""
        z0 = (kl_policy_logps.float() - kl_reference_logps.float()).mean().clamp(min=0).detach()
        r = policy_logps.float() - reference_logps.float()
        good = desirable.bool()
        v = torch.where(
            good,
            self.desirable_weight * torch.sigmoid(self.beta * (r - z0)),
            self.undesirable_weight * torch.sigmoid(self.beta * (z0 - r)),
        )
        lam = torch.where(good, self.desirable_weight, self.undesirable_weight)
        return lam - v, (self.beta * r).detach(), z0


def mismatched_pairs(
    tokens: torch.Tensor, labels: torch.Tensor, pad_id: int, *, ignore_index: int = -100
) -> tuple[torch.Tensor, torch.Tensor]:
    """KTO's KL batch: row i's prompt followed by row (i+1) mod N's response.

    `tokens`, `labels` `[N,S]` right-padded, labels shifted (`labels[t]` = token t+1, ignore_index on
    the prompt and padding). Returns `(tokens [N,S'], labels [N,S'])` in the same layout.
    """
    n = tokens.shape[0]
    has_target = labels != ignore_index  # [N,S]
    positions = torch.arange(labels.shape[1], device=labels.device)
    first = (
        torch.where(has_target, positions, labels.shape[1]).min(1).values
    )  # predicts the 1st response token
    last = (positions * has_target.long()).argmax(1)  # predicts the response's last token
    prompts = [tokens[i, : int(first[i]) + 1] for i in range(n)]
    responses = [tokens[i, int(first[i]) + 1 : int(last[i]) + 2] for i in range(n)]
    rows = [(prompts[i], responses[(i + 1) % n]) for i in range(n)]
    width = max(len(p) + len(r) for p, r in rows)
    out_tokens = torch.full((n, width), pad_id, dtype=tokens.dtype, device=tokens.device)
    out_labels = torch.full((n, width), ignore_index, dtype=labels.dtype, device=labels.device)
    for i, (p, r) in enumerate(rows):
        out_tokens[i, : len(p) + len(r)] = torch.cat([p, r])
        out_labels[i, len(p) - 1 : len(p) - 1 + len(r)] = r
    return out_tokens, out_labels
