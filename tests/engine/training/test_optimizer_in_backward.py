"""Optimizer-in-backward gives the same weights as a normal AdamW step, with a schedule and a resume."""

import copy
import functools

import pytest
import torch
from torch import nn

from engine.config import ConfigError
from engine.training import cosine_schedule_with_warmup, setup_optimizer_in_backward

ADAMW = functools.partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95))


def _model(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(40, 16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 40))
    model[0].weight.requires_grad_(False)  # a frozen parameter gets no optimizer
    return model


def _batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, 40, (4, 6), generator=g), torch.randint(0, 40, (4, 6), generator=g))
        for _ in range(n)
    ]


def _loss(model, batch):
    tokens, labels = batch
    return nn.functional.cross_entropy(model(tokens).view(-1, 40), labels.view(-1))


def test_same_weights_as_normal_adamw_with_cosine_schedule():
    ref, ours = _model(), _model()
    opt = ADAMW(p for p in ref.parameters() if p.requires_grad)
    sched = cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=6)
    in_bwd = setup_optimizer_in_backward(ours, ADAMW)
    sched_bwd = cosine_schedule_with_warmup(in_bwd, num_warmup_steps=2, num_training_steps=6)
    for batch in _batches(6):
        _loss(ref, batch).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        _loss(ours, batch).backward()
        assert all(p.grad is None for p in ours.parameters())  # every gradient freed after its update
        in_bwd.step()
        sched_bwd.step()
        assert in_bwd.lr == pytest.approx(opt.param_groups[0]["lr"])
    for a, b in zip(ref.parameters(), ours.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_state_dict_resume_continues_identically():
    batches = _batches(5, seed=2)
    straight = _model()
    opt = setup_optimizer_in_backward(straight, ADAMW)
    sched = cosine_schedule_with_warmup(opt, num_warmup_steps=1, num_training_steps=5)
    for i, batch in enumerate(batches):
        _loss(straight, batch).backward()
        opt.step()
        sched.step()
        if i == 2:
            saved = (
                copy.deepcopy(straight.state_dict()),
                copy.deepcopy(opt.state_dict()),
                sched.state_dict(),
            )

    resumed = _model(seed=9)
    resumed.load_state_dict(saved[0])
    # Order as for any optimizer: build both, then load the optimizer, then the scheduler.
    opt2 = setup_optimizer_in_backward(resumed, ADAMW)
    sched2 = cosine_schedule_with_warmup(opt2, num_warmup_steps=1, num_training_steps=5)
    opt2.load_state_dict(saved[1])
    sched2.load_state_dict(saved[2])
    assert opt2.lr == pytest.approx(sched2.get_last_lr()[0])
    for batch in batches[3:]:
        _loss(resumed, batch).backward()
        opt2.step()
        sched2.step()
    for a, b in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_mismatched_state_is_refused():
    opt = setup_optimizer_in_backward(_model(), ADAMW)
    state = opt.state_dict()
    state["optimizers"].pop("1.weight")
    with pytest.raises(ConfigError, match="does not match the model"):
        setup_optimizer_in_backward(_model(), ADAMW).load_state_dict(state)


def test_refuses_accumulation_and_clipping():
    with pytest.raises(
        ConfigError, match="gradient_accumulation_steps: 4 .* set gradient_accumulation_steps=1"
    ):
        setup_optimizer_in_backward(_model(), ADAMW, gradient_accumulation_steps=4)
    with pytest.raises(ConfigError, match="clip_grad_norm"):
        setup_optimizer_in_backward(_model(), ADAMW, clip_grad_norm=1.0)


def test_remove_hooks_restores_normal_grads():
    model = _model()
    opt = setup_optimizer_in_backward(model, ADAMW)
    opt.remove_hooks()
    _loss(model, _batches(1)[0]).backward()
    assert model[1].weight.grad is not None
