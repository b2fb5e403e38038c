"""Accumulating token-normalised micro-batch sums equals the full batch, exactly."""

import torch

from engine.modules.loss import LinearCrossEntropyLoss
from engine.training import count_step_tokens, scale_for_step
from tests.engine.training.tiny_decoder import tiny_decoder


def _batch():
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 128, (6, 10), generator=g)
    labels = torch.randint(0, 128, (6, 10), generator=g)
    for row, n in enumerate([0, 7, 2, 9, 4, 10]):  # uneven prompt lengths: uneven token counts
        labels[row, :n] = -100
    return tokens, labels


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_accumulation_equals_full_batch():
    tokens, labels = _batch()
    full = tiny_decoder()
    loss_fn = LinearCrossEntropyLoss(chunk_size=16)
    full_loss = loss_fn(full.forward_hidden(tokens), full.output_weight, labels)
    full_loss.backward()

    acc = tiny_decoder()
    sum_loss = LinearCrossEntropyLoss(chunk_size=16, reduction="sum")
    micro = [(tokens[i : i + 2], labels[i : i + 2]) for i in range(0, 6, 2)]
    total = count_step_tokens([lab for _, lab in micro])
    assert total == int((labels != -100).sum())
    logged = 0.0
    for t, lab in micro:
        loss = scale_for_step(sum_loss(acc.forward_hidden(t), acc.output_weight, lab), total)
        loss.backward()
        logged += loss.item()
    assert abs(logged - full_loss.item()) < 1e-5
    for a, b in zip(_grads(full), _grads(acc)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)

    # The naive rule (mean of per-micro-batch means) does not match: the test can tell them apart.
    naive = tiny_decoder()
    for t, lab in micro:
        (loss_fn(naive.forward_hidden(t), naive.output_weight, lab) / len(micro)).backward()
    assert not torch.allclose(_grads(naive)[-1], _grads(full)[-1], atol=1e-6, rtol=1e-5)


def test_empty_step_scales_to_zero():
    loss = torch.tensor(0.0, requires_grad=True)
    assert scale_for_step(loss, 0).item() == 0.0
