"""ChunkedCrossEntropyLoss against plain `F.cross_entropy` on the same fp32 logits."""

import pytest
import torch
import torch.nn.functional as F

from engine.config import ConfigError
from engine.modules.loss import ChunkedCrossEntropyLoss


def _batch(seed=0, b=2, s=12, v=50):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, s, v, generator=g)
    labels = torch.randint(0, v, (b, s), generator=g)
    labels[0, :5] = -100
    labels[1, -3:] = -100
    return logits, labels


@pytest.mark.parametrize("chunks", [1, 3, 8])
def test_mean_value_and_grad_match_plain_ce(chunks):
    logits, labels = _batch()
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    ours = ChunkedCrossEntropyLoss(num_output_chunks=chunks)(a, labels)
    ref = F.cross_entropy(b.view(-1, 50), labels.view(-1), ignore_index=-100)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-6)


def test_list_of_chunks_sum_and_none():
    logits, labels = _batch(1)
    ref = F.cross_entropy(logits.view(-1, 50), labels.view(-1), reduction="none").view(2, 12)
    chunks = list(logits.split([5, 7], dim=1))
    torch.testing.assert_close(
        ChunkedCrossEntropyLoss(reduction="sum")(chunks, labels), ref.sum(), atol=1e-5, rtol=1e-6
    )
    torch.testing.assert_close(ChunkedCrossEntropyLoss(reduction="none")(chunks, labels), ref)


def test_bf16_logits_are_upcast():
    logits, labels = _batch(2)
    ours = ChunkedCrossEntropyLoss()(logits.bfloat16(), labels)
    ref = F.cross_entropy(logits.bfloat16().float().view(-1, 50), labels.view(-1))
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-6)


def test_all_ignored_is_zero_with_zero_grad():
    logits, labels = _batch(3)
    labels.fill_(-100)
    x = logits.requires_grad_()
    loss = ChunkedCrossEntropyLoss()(x, labels)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(x.grad) == 0


def test_bad_options_name_the_field():
    with pytest.raises(ConfigError, match="num_output_chunks"):
        ChunkedCrossEntropyLoss(num_output_chunks=0)
    with pytest.raises(ConfigError, match="reduction"):
        ChunkedCrossEntropyLoss(reduction="avg")
