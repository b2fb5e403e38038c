"""LinearCrossEntropyLoss equals plain cross-entropy on materialised logits, in value and gradients."""

import pytest
import torch
import torch.nn.functional as F

from engine.config import ConfigError
from engine.modules.loss import LinearCrossEntropyLoss

B, S, D, V = 2, 16, 24, 97


def _inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, S, D, generator=g).to(dtype)
    weight = (torch.randn(V, D, generator=g) * 0.2).to(dtype)
    labels = torch.randint(0, V, (B, S), generator=g)
    labels[0, :6] = -100  # a prompt
    labels[1, -4:] = -100  # padding
    return hidden, weight, labels


def _reference(hidden, weight, labels, reduction="mean"):
    logits = (hidden @ weight.t()).float()  # [B, S, V], materialised
    return F.cross_entropy(logits.view(-1, V), labels.view(-1), ignore_index=-100, reduction=reduction)


def _both(loss_fn, hidden, weight, labels, reduction="mean"):
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ours = loss_fn(h1, w1, labels)
    ref = _reference(h2, w2, labels, reduction)
    (ours * 1.7).backward()  # a non-unit upstream gradient
    (ref * 1.7).backward()
    return (ours, h1.grad, w1.grad), (ref, h2.grad, w2.grad)


@pytest.mark.parametrize("opts", [{}, {"chunk_size": 5}, {"num_chunks": 3}, {"chunk_size": 1}])
def test_value_and_gradients_match_plain_ce_fp32(opts):
    hidden, weight, labels = _inputs()
    ours, ref = _both(LinearCrossEntropyLoss(**opts), hidden, weight, labels)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_sum_reduction_matches():
    hidden, weight, labels = _inputs(1)
    ours, ref = _both(LinearCrossEntropyLoss(chunk_size=7, reduction="sum"), hidden, weight, labels, "sum")
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_all_tokens_ignored_gives_zero_and_zero_grads():
    hidden, weight, labels = _inputs(2)
    labels.fill_(-100)
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    loss = LinearCrossEntropyLoss(chunk_size=4)(h, w, labels)
    loss.backward()
    assert loss.item() == 0.0 and not torch.isnan(loss)
    assert torch.count_nonzero(h.grad) == 0 and torch.count_nonzero(w.grad) == 0


def test_per_token_losses_and_no_grad_mode():
    hidden, weight, labels = _inputs(3)
    ref = F.cross_entropy((hidden @ weight.t()).view(-1, V), labels.view(-1), reduction="none").view(B, S)
    loss, per_token = LinearCrossEntropyLoss(chunk_size=6)(hidden, weight, labels, return_per_token=True)
    torch.testing.assert_close(per_token, ref, atol=1e-5, rtol=1e-5)
    assert not per_token.requires_grad
    with torch.no_grad():
        no_grad = LinearCrossEntropyLoss(chunk_size=6)(hidden, weight, labels)
    torch.testing.assert_close(no_grad, loss)


def test_bf16_close_to_fp32_reference():
    hidden, weight, labels = _inputs(4, torch.bfloat16)
    ours, ref = _both(LinearCrossEntropyLoss(chunk_size=8), hidden, weight, labels)
    assert ours[1].dtype == torch.bfloat16 and ours[2].dtype == torch.bfloat16
    # bf16 matmuls on both sides; tolerance of bf16 rounding.
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)


def test_only_hidden_requires_grad():
    hidden, weight, labels = _inputs(5)
    h = hidden.clone().requires_grad_()
    LinearCrossEntropyLoss()(h, weight, labels).backward()
    h2 = hidden.clone().requires_grad_()
    _reference(h2, weight, labels).backward()
    torch.testing.assert_close(h.grad, h2.grad, atol=1e-5, rtol=1e-5)


def test_bad_options_name_the_field():
    with pytest.raises(ConfigError, match="only one"):
        LinearCrossEntropyLoss(num_chunks=2, chunk_size=3)
    with pytest.raises(ConfigError, match="chunk_size"):
        LinearCrossEntropyLoss(chunk_size=0)
    with pytest.raises(ConfigError, match="reduction"):
        LinearCrossEntropyLoss(reduction="none")


def _decoder_case(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (2, 12), generator=g)
    labels = torch.randint(0, 256, (2, 12), generator=g)
    labels[:, :4] = -100
    return tokens, labels


@pytest.mark.parametrize("builder", ["llama3_tiny", "qwen2_tiny", "lora_output"])
def test_on_the_real_decoder_matches_ce_on_its_logits(builder):
    """`forward_hidden` + `output_weight` through LCE == CE on `model(tokens)`, for every parameter's grad."""
    from engine.models.llama3 import llama3_tiny, lora_llama3_tiny
    from engine.models.qwen2 import qwen2_tiny

    def build():
        torch.manual_seed(0)
        if builder == "lora_output":  # the output weight is `W + scale * B A` (merged_weight)
            model = lora_llama3_tiny(lora_rank=4, lora_alpha=8, apply_lora_to_output=True)
            for name, p in model.named_parameters():
                if "lora_b" in name:
                    torch.nn.init.normal_(p, std=0.02)  # B = 0 at init would leave A without gradient
            return model
        return {"llama3_tiny": llama3_tiny, "qwen2_tiny": qwen2_tiny}[builder]()

    ours, ref = build(), build()
    tokens, labels = _decoder_case(ours)
    loss = LinearCrossEntropyLoss(chunk_size=5)(ours.forward_hidden(tokens), ours.output_weight, labels)
    loss.backward()
    ref_loss = F.cross_entropy(ref(tokens).view(-1, 256), labels.view(-1), ignore_index=-100)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    checked = 0
    for (name, p), (_, q) in zip(ours.named_parameters(), ref.named_parameters(), strict=True):
        if q.grad is None:
            assert p.grad is None, name
            continue
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
        checked += 1
    assert checked > 0
