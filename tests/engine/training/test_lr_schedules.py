"""LR schedules: warmup values and the decay shapes at known points."""

import math

import pytest
import torch

from engine.config import ConfigError
from engine.training import (
    constant_schedule_with_warmup,
    cosine_schedule_with_warmup,
    linear_schedule_with_warmup,
)


def _lrs(make, steps):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_cosine_with_warmup():
    lrs = _lrs(lambda o: cosine_schedule_with_warmup(o, 4, 12, min_lr_ratio=0.1), 14)
    assert lrs[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert lrs[4] == pytest.approx(2.0)  # the decay starts at the base lr
    assert lrs[8] == pytest.approx(2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))))
    assert lrs[12] == pytest.approx(0.2) and lrs[13] == pytest.approx(0.2)  # floor, held past the end
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))


def test_linear_and_constant():
    lin = _lrs(lambda o: linear_schedule_with_warmup(o, 2, 6), 7)
    assert lin == pytest.approx([1.0, 2.0, 2.0, 1.5, 1.0, 0.5, 0.0])
    const = _lrs(lambda o: constant_schedule_with_warmup(o, 2), 4)
    assert const == pytest.approx([1.0, 2.0, 2.0, 2.0])
    assert _lrs(lambda o: constant_schedule_with_warmup(o), 2) == pytest.approx([2.0, 2.0])


def test_bad_arguments_name_the_field():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ConfigError, match="num_warmup_steps: 20 exceeds"):
        cosine_schedule_with_warmup(opt, 20, 10)
    with pytest.raises(ConfigError, match="num_training_steps"):
        linear_schedule_with_warmup(opt, 0, 0)
    with pytest.raises(ConfigError, match="min_lr_ratio"):
        cosine_schedule_with_warmup(opt, 0, 10, min_lr_ratio=2)
