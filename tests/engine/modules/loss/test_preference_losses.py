"""ORPO, SimPO, KTO and Bradley-Terry losses against each paper's equation, written out with `math`
on small numbers (scalar by scalar, independent of the tensor code under test)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.config import ConfigError
from engine.modules.loss import BradleyTerryLoss, KTOLoss, ORPOLoss, SimPOLoss


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# Summed response log-probs and lengths of three pairs.
CHOSEN = [-4.0, -12.5, -3.0]
REJECTED = [-6.0, -9.0, -30.0]
LEN_C = [4, 10, 2]
LEN_R = [3, 6, 15]


def _t(xs):
    return torch.tensor(xs, dtype=torch.float64)


def test_orpo_matches_the_paper():
    # Hong et al. 2024, eq. (6)-(7): L = L_SFT + lambda * L_OR, L_OR = -log sigmoid(log(odds_w / odds_l)),
    # odds(y|x) = P / (1 - P), P = exp(mean token log-prob).
    lam = 0.25
    losses, rc, rr = ORPOLoss(beta=lam)(_t(CHOSEN), _t(REJECTED), _t(LEN_C), _t(LEN_R))
    for i in range(3):
        p_w = math.exp(CHOSEN[i] / LEN_C[i])
        p_l = math.exp(REJECTED[i] / LEN_R[i])
        odds_w, odds_l = p_w / (1 - p_w), p_l / (1 - p_l)
        l_or = -math.log(_sigmoid(math.log(odds_w / odds_l)))
        l_sft = -CHOSEN[i] / LEN_C[i]
        torch.testing.assert_close(losses[i].item(), l_sft + lam * l_or, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(rc[i].item(), lam * CHOSEN[i] / LEN_C[i], rtol=1e-6, atol=1e-9)


def test_orpo_gradient_raises_chosen_and_lowers_rejected():
    c = _t(CHOSEN).requires_grad_(True)
    r = _t(REJECTED).requires_grad_(True)
    ORPOLoss(beta=0.1)(c, r, _t(LEN_C), _t(LEN_R))[0].sum().backward()
    assert (c.grad < 0).all() and (r.grad > 0).all()


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_simpo_matches_the_paper(label_smoothing):
    # Meng et al. 2024, eq. (6): L = -log sigmoid(beta/|y_w| log pi(y_w|x) - beta/|y_l| log pi(y_l|x) - gamma)
    beta, gamma = 2.0, 0.8
    losses, rc, rr = SimPOLoss(beta=beta, gamma=gamma, label_smoothing=label_smoothing)(
        _t(CHOSEN), _t(REJECTED), _t(LEN_C), _t(LEN_R)
    )
    for i in range(3):
        z = beta / LEN_C[i] * CHOSEN[i] - beta / LEN_R[i] * REJECTED[i] - gamma
        want = -(1 - label_smoothing) * math.log(_sigmoid(z)) - label_smoothing * math.log(_sigmoid(-z))
        torch.testing.assert_close(losses[i].item(), want, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(rr[i].item(), beta * REJECTED[i] / LEN_R[i], rtol=1e-6, atol=1e-9)


def test_kto_matches_the_paper():
    # Ethayarajh et al. 2024, eq. (8): r = log pi/pi_ref, z0 = max(0, KL estimate), v = lambda_D sigma(beta(r - z0))
    # for desirable, lambda_U sigma(beta(z0 - r)) for undesirable, L = lambda_y - v.
    beta, lam_d, lam_u = 0.5, 1.0, 1.5
    pol = [-5.0, -7.0, -3.0, -9.0]
    ref = [-6.0, -6.5, -3.5, -8.0]
    good = [True, False, True, False]
    kl_pol, kl_ref = [-10.0, -11.0, -9.5], [-10.4, -11.1, -10.0]
    losses, rewards, z0 = KTOLoss(beta=beta, desirable_weight=lam_d, undesirable_weight=lam_u)(
        _t(pol), _t(ref), torch.tensor(good), _t(kl_pol), _t(kl_ref)
    )
    z = max(0.0, sum(p - q for p, q in zip(kl_pol, kl_ref)) / 3)
    torch.testing.assert_close(z0.item(), z, rtol=1e-6, atol=1e-9)
    for i in range(4):
        r = pol[i] - ref[i]
        v = lam_d * _sigmoid(beta * (r - z)) if good[i] else lam_u * _sigmoid(beta * (z - r))
        torch.testing.assert_close(losses[i].item(), (lam_d if good[i] else lam_u) - v, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(rewards[i].item(), beta * r, rtol=1e-6, atol=1e-9)


def test_kto_reference_point_is_clamped_at_zero_and_not_trained():
    kl_pol = _t([-10.0, -11.0]).requires_grad_(True)
    pol = _t([-5.0]).requires_grad_(True)
    losses, _, z0 = KTOLoss()(pol, _t([-5.0]), torch.tensor([True]), kl_pol, _t([-9.0, -10.0]))
    assert z0.item() == 0.0  # the estimate was negative
    losses.sum().backward()
    assert kl_pol.grad is None and pol.grad.item() < 0


def test_bradley_terry_with_margins():
    # Ouyang et al. 2022 eq. (1); Llama 2 eq. (2) with a margin m(r).
    rc, rr, m = [1.5, -0.2, 0.3], [0.5, 0.4, 0.3], [0.0, 1.0, 0.5]
    losses = BradleyTerryLoss(margin=0.1)(_t(rc), _t(rr), _t(m))
    for i in range(3):
        want = -math.log(_sigmoid(rc[i] - rr[i] - 0.1 - m[i]))
        torch.testing.assert_close(losses[i].item(), want, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(
    "build",
    [
        lambda: ORPOLoss(beta=0),
        lambda: SimPOLoss(gamma=-1),
        lambda: SimPOLoss(label_smoothing=0.5),
        lambda: KTOLoss(desirable_weight=0),
        lambda: BradleyTerryLoss(margin=-1),
    ],
)
def test_bad_settings_are_one_config_error(build):
    with pytest.raises(ConfigError, match="loss."):
        build()
