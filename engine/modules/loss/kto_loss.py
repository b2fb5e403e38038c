"""KTO (Ethayarajh et al., 2024, "KTO: Model Alignment as Prospect Theoretic Optimization").

Works on unpaired examples, each desirable or undesirable. With the implied reward
`r(x, y) = log pi(y|x) - log pi_ref(y|x)` and the reference point `z0 = max(0, KL(pi || pi_ref))`:

    v(x, y) = lambda_D * sigmoid(beta * (r - z0))   if y is desirable
              lambda_U * sigmoid(beta * (z0 - r))   if y is undesirable
    L = E[lambda_y - v(x, y)]

`z0` is estimated, as in the paper, from mismatched pairs `(x, y')` of the same micro-batch (each
prompt with another example's completion): the mean of `log pi(y'|x) - log pi_ref(y'|x)`, clamped at 0
and not back-propagated.

Several ranks: the micro-batch is the global one (every rank's rows together, in the order one process
with the whole batch sees them). `global_mismatched_pairs` builds the mismatched rows of that global
batch and gives each rank its share to score; `KTOLoss` all-reduces the KL sum and count, so `z0` is
one number for the whole step on every rank (TRL gathers its per-device KL the same way, detached),
and N ranks with batch B train exactly as one process with batch N * B.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
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
        """`(losses [N], rewards [N] detached, z0 [])`.

        Under `torch.distributed` the `[M]` KL rows are this rank's share of the global micro-batch's
        (`global_mismatched_pairs`): every rank must call this, once per micro-batch (an all-reduce).
        """
        z0 = reference_point(kl_policy_logps, kl_reference_logps)
        r = policy_logps.float() - reference_logps.float()
        good = desirable.bool()
        v = torch.where(
            good,
            self.desirable_weight * torch.sigmoid(self.beta * (r - z0)),
            self.undesirable_weight * torch.sigmoid(self.beta * (z0 - r)),
        )
        lam = torch.where(good, self.desirable_weight, self.undesirable_weight)
        return lam - v, (self.beta * r).detach(), z0


def reference_point(kl_policy_logps: torch.Tensor, kl_reference_logps: torch.Tensor) -> torch.Tensor:
    """`z0 = max(0, mean(kl_policy - kl_reference))` over every rank's rows (all-reduced sum and count,
    no gradient); one process: the plain mean. Returns a 0-d float32 tensor."""
    diff = kl_policy_logps.detach().double() - kl_reference_logps.detach().double()
    total = torch.stack(
        [diff.sum(), torch.tensor(float(diff.numel()), dtype=torch.float64, device=diff.device)]
    )
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return (total[0] / total[1].clamp(min=1)).clamp(min=0).float()


def _gather_rows(t: torch.Tensor, fill: int) -> torch.Tensor:
    """Every rank's `[N,S]` rows in the order one process with the global batch holds them.

    `EpochBatchSampler` gives rank r the global batch's items r, r + W, r + 2W, ... (W ranks), so
    row j of rank r is global row `j * W + r`. Rows are right-padded with `fill` to the widest rank's.
    """
    world = dist.get_world_size()
    width = torch.tensor([t.shape[1]], device=t.device)
    dist.all_reduce(width, op=dist.ReduceOp.MAX)
    padded = torch.full((t.shape[0], int(width)), fill, dtype=t.dtype, device=t.device)
    padded[:, : t.shape[1]] = t
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.stack(parts, 1).reshape(t.shape[0] * world, int(width))  # [N*W, S]: j*W + r


def _stack(rows: list[torch.Tensor], fill: int) -> torch.Tensor:
    """`[N_i,S_i]` blocks stacked into one `[sum N_i, max S_i]`, right-padded with `fill`."""
    width = max(t.shape[1] for t in rows)
    return torch.cat([F.pad(t, (0, width - t.shape[1]), value=fill) for t in rows])


def global_mismatched_pairs(
    blocks: list[tuple[torch.Tensor, torch.Tensor]], pad_id: int, *, ignore_index: int = -100
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of the global micro-batch's mismatched rows (`mismatched_pairs`).

    `blocks`: `(tokens [N,S], labels [N,S])` blocks in the order the rows are scored (paired KTO:
    chosen, then rejected; unpaired: one block). Each block is gathered over ranks (`_gather_rows`),
    the blocks are stacked, `mismatched_pairs` pairs the global rows, and rank r keeps rows r, r + W,
    ...: the ranks' shares together are exactly what one process with the whole batch scores. One
    process: `mismatched_pairs` of the stacked blocks.
    """
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world > 1:
        blocks = [(_gather_rows(t, pad_id), _gather_rows(lab, ignore_index)) for t, lab in blocks]
    tokens = _stack([t for t, _ in blocks], pad_id)
    labels = _stack([lab for _, lab in blocks], ignore_index)
    kl_tokens, kl_labels = mismatched_pairs(tokens, labels, pad_id, ignore_index=ignore_index)
    if world == 1:
        return kl_tokens, kl_labels
    rank = dist.get_rank()
    return kl_tokens[rank::world], kl_labels[rank::world]


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
