"""GAE, KL-shaped rewards, whitening and the KL controllers against hand computation."""

from __future__ import annotations

import math

import pytest
import torch

from engine.rl.ppo_advantages import (
    AdaptiveKLController,
    FixedKLController,
    gae,
    kl_penalised_rewards,
    mean_sequence_kl,
    whiten,
)


def _gae_by_hand(rewards, values, length, gamma, lam):
    """Schulman et al. 2016 eq. (16), one row: A_t = sum_l (gamma lam)^l delta_{t+l}, V after the end = 0."""
    deltas = []
    for t in range(length):
        nxt = values[t + 1] if t + 1 < length else 0.0
        deltas.append(rewards[t] + gamma * nxt - values[t])
    return [sum((gamma * lam) ** k * deltas[t + k] for k in range(length - t)) for t in range(length)]


def test_gae_matches_the_sum_of_discounted_deltas():
    rewards = [[0.1, -0.2, 0.3, 1.0], [0.5, 2.0, 9.0, 9.0]]
    values = [[0.4, 0.3, -0.1, 0.2], [1.0, -1.0, 5.0, 5.0]]
    lengths = [4, 2]  # the second row's last two entries are padding (ignored)
    mask = torch.tensor([[t < n for t in range(4)] for n in lengths])
    gamma, lam = 0.9, 0.8
    adv, ret = gae(torch.tensor(rewards), torch.tensor(values), mask, gamma=gamma, lam=lam)
    for b in range(2):
        want = _gae_by_hand(rewards[b], values[b], lengths[b], gamma, lam)
        for t in range(4):
            if t < lengths[b]:
                torch.testing.assert_close(adv[b, t].item(), want[t], rtol=1e-6, atol=1e-6)
                torch.testing.assert_close(ret[b, t].item(), want[t] + values[b][t], rtol=1e-6, atol=1e-6)
            else:
                assert adv[b, t].item() == 0.0 and ret[b, t].item() == 0.0


def test_gae_with_gamma_lambda_one_is_reward_to_go_minus_value():
    r = torch.tensor([[1.0, 2.0, 3.0]])
    v = torch.tensor([[0.5, 0.5, 0.5]])
    adv, ret = gae(r, v, torch.ones(1, 3, dtype=torch.bool), gamma=1.0, lam=1.0)
    torch.testing.assert_close(ret, torch.tensor([[6.0, 5.0, 3.0]]))
    torch.testing.assert_close(adv, torch.tensor([[5.5, 4.5, 2.5]]))


def test_kl_shaped_rewards_put_the_score_on_the_last_token():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -0.9, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    rewards, kl = kl_penalised_rewards(torch.tensor([2.0, -1.0]), logp, ref, mask, kl_coeff=0.1)
    want = [[-0.1 * 0.5, -0.1 * -1.0, 2.0], [-0.1 * -0.1, -0.1 * 0.2 - 1.0, 0.0]]
    torch.testing.assert_close(rewards, torch.tensor(want), rtol=1e-6, atol=1e-6)
    assert kl[1, 2].item() == 0.0


def test_whiten_over_the_mask():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    w = whiten(x, mask)
    vals = [1.0, 2.0, 3.0, 4.0]
    mean = sum(vals) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / 4)
    torch.testing.assert_close(w[0], torch.tensor([(v - mean) / std for v in vals[:3]]), rtol=1e-5, atol=1e-5)
    assert w[1, 1].item() == 0.0
    kept = whiten(x, mask, shift_mean=False)
    torch.testing.assert_close(kept[1, 0].item(), (4.0 - mean) / std + mean, rtol=1e-5, atol=1e-5)


def test_adaptive_kl_controller_follows_ziegler_et_al():
    c = AdaptiveKLController(0.2, target=6.0, horizon=100)
    assert c.update(12.0, 10) == pytest.approx(0.2 * (1 + 0.2 * 10 / 100))  # error clipped at +0.2
    before = c.value
    assert c.update(5.4, 10) == pytest.approx(before * (1 + (5.4 / 6 - 1) * 10 / 100))
    assert FixedKLController(0.05).update(100.0, 10) == 0.05


def test_kl_shaped_rewards_with_a_prompt_before_the_response():
    # the rollout layout: response positions start after the prompt
    mask = torch.tensor([[False, True, True, False]])
    logp = torch.zeros(1, 4)
    rewards, _ = kl_penalised_rewards(torch.tensor([3.0]), logp, logp, mask, kl_coeff=0.1)
    assert rewards.tolist() == [[0.0, 0.0, 3.0, 0.0]]
    adv, ret = gae(rewards, torch.zeros(1, 4), mask, gamma=1.0, lam=1.0)
    assert ret.tolist() == [[0.0, 3.0, 3.0, 0.0]]


def test_controller_sequence_on_sequence_kl_by_hand():
    """Three batches of two rollouts as the PPO recipe runs them: the penalty uses the current beta,
    the controller then sees the KL summed over each sequence's tokens (nats per sequence, kl_target's
    units) averaged over the rollouts, with n_steps = 2 rollouts. Every figure below is by hand."""
    mask = torch.tensor([[True, True, False], [True, True, True]])
    ref = torch.zeros(2, 3)
    batches = [  # logp - ref per token; the masked-out entry must not count
        torch.tensor([[0.5, 0.3, 9.0], [1.0, -0.2, 0.4]]),  # sequences 0.8 and 1.2: mean 1.0
        torch.tensor([[2.0, 0.4, 9.0], [1.0, 0.5, 0.5]]),  # 2.4 and 2.0: mean 2.2
        torch.tensor([[3.0, 3.0, 9.0], [2.0, 1.0, 1.0]]),  # 6.0 and 4.0: mean 5.0
    ]
    c = AdaptiveKLController(0.1, target=2.0, horizon=10)
    # e = clip(1.0/2 - 1) = -0.2; clip(2.2/2 - 1) = +0.1; clip(5.0/2 - 1) = +0.2; gain n/H = 2/10
    want_betas = [
        0.1,
        0.1 * (1 - 0.2 * 0.2),
        0.1 * 0.96 * (1 + 0.1 * 0.2),
        0.1 * 0.96 * 1.02 * (1 + 0.2 * 0.2),
    ]
    assert want_betas[1:] == pytest.approx([0.096, 0.09792, 0.1018368], rel=1e-12)
    for i, logp in enumerate(batches):
        beta = c.value
        assert beta == pytest.approx(want_betas[i], rel=1e-6)  # the KLs are fp32 sums
        rewards, kl = kl_penalised_rewards(torch.tensor([1.0, 0.0]), logp, ref, mask, kl_coeff=beta)
        # the penalty enters each token's reward with the current beta; the score on the last token
        torch.testing.assert_close(rewards[0, 0], torch.tensor(-beta * logp[0, 0].item()))
        torch.testing.assert_close(rewards[0, 1], torch.tensor(-beta * logp[0, 1].item() + 1.0))
        assert rewards[0, 2].item() == 0.0
        seq_kl = mean_sequence_kl(kl)
        assert seq_kl == pytest.approx([1.0, 2.2, 5.0][i], rel=1e-6)
        c.update(seq_kl, 2)
    assert c.value == pytest.approx(want_betas[3], rel=1e-6)
