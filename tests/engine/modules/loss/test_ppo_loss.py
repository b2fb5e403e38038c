"""PPO's clipped losses against hand-computed values (Schulman et al. 2017, eq. 7 and the value clip of
the PPO2 baselines), scalar by scalar with plain Python (the loss computes in fp32: rtol 1e-6)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.config import ConfigError
from engine.modules.loss import PPOLoss

LOGP = [[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]]
OLD = [[-1.2, -1.5, -0.5], [-0.4, -3.1, 0.0]]
ADV = [[1.0, -2.0, 0.5], [-1.0, 3.0, 9.0]]
V = [[0.5, 0.1, -0.4], [1.0, 0.0, 7.0]]
V_OLD = [[0.2, 0.15, -0.1], [0.2, 0.05, 0.0]]
RET = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
MASK = [[True, True, True], [True, True, False]]


def _t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def test_clipped_policy_and_value_losses_match_hand_computation():
    eps, vclip, coeff = 0.2, 0.2, 0.5
    loss, stats = PPOLoss(epsilon=eps, value_clip=vclip, value_coeff=coeff)(
        _t(LOGP), _t(OLD), _t(ADV), _t(V), _t(V_OLD), _t(RET), torch.tensor(MASK)
    )
    pg, vf, clipped, n, approx = 0.0, 0.0, 0, 0, 0.0
    for b in range(2):
        for t in range(3):
            if not MASK[b][t]:
                continue
            n += 1
            rho = math.exp(LOGP[b][t] - OLD[b][t])
            rho_c = min(max(rho, 1 - eps), 1 + eps)
            a = ADV[b][t]
            pg += max(-a * rho, -a * rho_c)
            clipped += -a * rho_c > -a * rho
            v_c = V_OLD[b][t] + min(max(V[b][t] - V_OLD[b][t], -vclip), vclip)
            vf += 0.5 * max((V[b][t] - RET[b][t]) ** 2, (v_c - RET[b][t]) ** 2)
            approx += rho - 1 - math.log(rho)
    torch.testing.assert_close(stats["policy_loss"].item(), pg / n, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(stats["value_loss"].item(), vf / n, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(loss.item(), pg / n + coeff * vf / n, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(stats["clip_fraction"].item(), clipped / n, rtol=0, atol=1e-7)
    torch.testing.assert_close(stats["approx_kl"].item(), approx / n, rtol=1e-6, atol=1e-7)
    assert 0 < clipped < n  # the example exercises both branches


def test_clipped_tokens_get_no_policy_gradient():
    logp = _t([[0.0, 0.0]]).requires_grad_(True)
    old = _t([[-1.0, -0.05]])  # ratios e (clipped for A>0) and ~1.05 (inside)
    adv = _t([[1.0, 1.0]])
    z = torch.zeros(1, 2, dtype=torch.float64)
    loss, _ = PPOLoss(value_coeff=1.0)(logp, old, adv, z, z, z, torch.ones(1, 2, dtype=torch.bool))
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[0, 1].item() < 0


def test_no_value_clip_is_the_plain_squared_error():
    v = _t([[2.0]])
    _, stats = PPOLoss(value_clip=None)(
        v, v, v, v, _t([[0.0]]), _t([[0.5]]), torch.ones(1, 1, dtype=torch.bool)
    )
    assert stats["value_loss"].item() == pytest.approx(0.5 * 1.5**2)


def test_bad_settings():
    with pytest.raises(ConfigError, match="loss.epsilon"):
        PPOLoss(epsilon=0)
    with pytest.raises(ConfigError, match="loss.value_clip"):
        PPOLoss(value_clip=-1)
