"""GRPO advantages and clipped loss against a hand computation on a fixed batch."""

import math

import pytest
import torch

from engine.config import ConfigError
from engine.modules.loss import GRPOLoss, group_advantages


def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])  # two groups of 4
    adv = group_advantages(rewards, 4, eps=0.0)
    # group 1: mean 0.5, unbiased std sqrt(((.5^2)*4)/3) = sqrt(1/3)
    s = math.sqrt(1 / 3)
    want = torch.tensor([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        group_advantages(rewards, 4, scale_by_std=False)[:4], torch.tensor([0.5, -0.5, -0.5, 0.5])
    )
    with pytest.raises(ConfigError, match="group_size"):
        group_advantages(rewards, 3)


def _hand_loss(logps, old, ref, adv, mask, eps_lo, eps_hi, beta):
    """Plain python loops: per token -min(r A, clip(r) A) + beta * k3, mean per sequence, then mean."""
    seq_losses, kls, clipped, n = [], 0.0, 0, 0
    for b in range(len(logps)):
        tok = []
        for t in range(len(logps[b])):
            if not mask[b][t]:
                continue
            r = math.exp(logps[b][t] - old[b][t])
            c = min(max(r, 1 - eps_lo), 1 + eps_hi)
            d = ref[b][t] - logps[b][t]
            k3 = math.exp(d) - d - 1
            tok.append(-min(r * adv[b], c * adv[b]) + beta * k3)
            kls += k3
            clipped += int((r * adv[b]) > (c * adv[b]))
            n += 1
        seq_losses.append(sum(tok) / len(tok))
    return sum(seq_losses) / len(seq_losses), kls / n, clipped / n


def test_grpo_loss_hand_computed():
    logps = [[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0]]
    old = [[-1.3, -1.9, -0.5], [-0.6, -2.0, -9.0]]
    ref = [[-1.1, -2.5, -0.4], [-0.3, -2.9, -9.0]]
    adv = [1.5, -0.7]
    mask = [[True, True, True], [True, True, False]]
    fn = GRPOLoss(epsilon=0.2, epsilon_high=0.28, kl_coeff=0.04)
    lp = torch.tensor(logps, requires_grad=True)
    loss, stats = fn(lp, torch.tensor(old), torch.tensor(adv), torch.tensor(mask), torch.tensor(ref))
    want, kl, clip = _hand_loss(logps, old, ref, adv, mask, 0.2, 0.28, 0.04)
    torch.testing.assert_close(loss.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        stats["kl"].double(), torch.tensor(kl, dtype=torch.float64), rtol=1e-6, atol=1e-6
    )
    torch.testing.assert_close(stats["clip_fraction"].item(), clip)
    loss.backward()
    assert lp.grad[1, 2] == 0  # masked token
    assert torch.isfinite(lp.grad).all()


def test_token_aggregation_weighs_every_token_equally():
    lp = torch.zeros(2, 3)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    fn = GRPOLoss(kl_coeff=0.0, aggregation="token")
    loss, _ = fn(lp, lp, torch.tensor([1.0, -1.0]), mask)
    torch.testing.assert_close(loss, torch.tensor((-3.0 + 1.0) / 4))
