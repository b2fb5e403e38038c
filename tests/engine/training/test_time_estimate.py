"""The run-time estimate: FLOPs per token against torch's FlopCounterMode on a real native model,
steps of a run, the matmul probe and its cache, and the demo config's figures."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from engine.training.memory_estimate import MemoryEstimateError, ModelShape
from engine.training.time_estimate import (
    EFFICIENCY,
    TimeEstimate,
    estimate_time,
    format_seconds,
    forward_flops_per_token,
    matmul_rate,
    steps_of_run,
    train_flops_per_token,
)

# llama3_tiny: 2 layers, dim 64, 4 query heads / 2 KV heads of 16, FFN 128, vocabulary 256, untied.
TINY = ModelShape(
    num_layers=2, dim=64, vocab_size=256, intermediate_dim=128, kv_dim=32, tied_embeddings=False
)


def _counted(model, tokens: torch.Tensor, backward: bool) -> int:
    with FlopCounterMode(display=False) as counter:
        out = model(tokens)
        if backward:
            out.sum().backward()
    counts = counter.get_flop_counts()["Global"]
    return sum(v for k, v in counts.items() if "scaled_dot_product" not in str(k))  # the linears


def test_forward_flops_equal_the_flop_counter_on_the_native_model():
    from engine.models.llama3 import llama3_tiny

    seq = 10
    # causal attention: scores and weighted sum, 2 FLOPs x 64 each per key, over seq/2 keys on average
    attention = TINY.num_layers * (2 * 2 * 64) * seq // 2
    # by hand: per layer q,o 64x64 each, k,v 64x32 each, MLP 3 x 64x128; the output 64x256; 2 FLOPs a MAC
    by_hand = 2 * (2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 64 * 256) + attention
    assert forward_flops_per_token(TINY, seq) == by_hand
    counted = _counted(llama3_tiny().eval(), torch.randint(0, 256, (2, seq)), backward=False)
    assert counted == (by_hand - attention) * 2 * seq  # exact: the counter sees every matmul


def test_training_flops_full_and_lora_against_the_flop_counter():
    from engine.models.llama3 import llama3_tiny, lora_llama3_tiny

    seq, tokens = 10, torch.randint(0, 256, (2, 10))
    linear_fwd = forward_flops_per_token(TINY, seq) - TINY.num_layers * 2 * seq * 64
    full = _counted(llama3_tiny(), tokens, backward=True) / (2 * seq)
    assert full == 3 * linear_fwd  # forward + input and weight gradients
    lora = lora_llama3_tiny(lora_attn_modules=("q_proj", "v_proj"), lora_rank=8)
    for name, p in lora.named_parameters():
        p.requires_grad_("lora" in name)  # as the recipe trains it: adapters only
    counted = _counted(lora, tokens, backward=True) / (2 * seq)
    # forward + input gradients; the rank-8 adapters add ~2% on a 64-wide model (less on real ones)
    assert counted == pytest.approx(2 * linear_fwd, rel=0.03)
    ratio = train_flops_per_token(TINY, method="lora", seq_len=seq) / forward_flops_per_token(TINY, seq)
    assert ratio == 2.0
    checkpointed = train_flops_per_token(TINY, method="full", seq_len=seq, activation_checkpointing=True)
    assert checkpointed == 4 * forward_flops_per_token(TINY, seq)
    with pytest.raises(MemoryEstimateError, match="method"):
        train_flops_per_token(TINY, method="dpo", seq_len=seq)


def test_steps_of_run():
    assert steps_of_run(rows=2940, rows_per_step=4, epochs=1, max_steps_per_epoch=40) == 40
    assert steps_of_run(rows=10, rows_per_step=4, epochs=2, max_steps_per_epoch=None) == 6  # 3 a epoch
    assert steps_of_run(rows=None, rows_per_step=4, epochs=3, max_steps_per_epoch=50) == 150
    assert steps_of_run(rows=None, rows_per_step=4, epochs=1, max_steps_per_epoch=None) is None


def test_estimate_seconds_by_hand():
    est = estimate_time(
        TINY, method="lora", seq_len=10, rows_per_step=4, steps=20, matmul_flops=1e9, device="cpu",
        source="test", validation_rows=8,
    )  # fmt: skip
    fwd = forward_flops_per_token(TINY, 10)
    per_step = 4 * 10 * 2 * fwd + 8 * 10 * fwd / 20
    assert est.flops_per_step == pytest.approx(per_step, rel=1e-12)
    assert est.seconds == pytest.approx(20 * per_step / (1e9 * EFFICIENCY), rel=1e-12)
    assert est.summary().endswith("for 20 steps on cpu (estimate; start-up not included)")
    unknown = TimeEstimate(None, 40, 8e9, 1e9, "cpu", "test", efficiency=0.5)
    assert unknown.seconds is None and unknown.summary() == "~16 s per step on cpu (estimate; steps unknown)"
    assert [format_seconds(s) for s in (0.2, 42, 400, 7200)] == ["1 s", "42 s", "7 min", "2.0 h"]


def test_matmul_rate_is_probed_once_then_cached(tmp_path, monkeypatch):
    import engine.training.time_estimate as te

    monkeypatch.delenv("TUNEBENCH_MATMUL_GFLOPS", raising=False)
    calls = []
    monkeypatch.setattr(te, "probe_matmul", lambda device, dtype: calls.append((device, dtype)) or 5e10)
    first, source = matmul_rate("cpu", "fp32", home=tmp_path)
    assert (first, calls) == (5e10, [("cpu", "fp32")]) and source.startswith("measured")
    again, source = matmul_rate("cpu", "fp32", home=tmp_path)
    assert again == 5e10 and len(calls) == 1 and source.startswith("cached")
    stored = json.loads((tmp_path / "cache" / "matmul_rate.json").read_text())
    assert [v["flops"] for v in stored.values()] == [5e10]
    matmul_rate("cpu", "fp32", home=tmp_path, refresh=True)
    assert len(calls) == 2


def test_matmul_probe_measures_a_positive_rate():
    from engine.training.time_estimate import probe_matmul

    assert probe_matmul("cpu", "fp32", seconds=0.05) > 1e7  # any CPU does 10 MFLOP/s


@pytest.mark.parametrize("value", ["fast", "0", "-3"])
def test_bad_matmul_override_is_one_clear_error(monkeypatch, value):
    monkeypatch.setenv("TUNEBENCH_MATMUL_GFLOPS", value)
    with pytest.raises(MemoryEstimateError, match="TUNEBENCH_MATMUL_GFLOPS=.*positive number of GFLOP/s"):
        matmul_rate()


def test_demo_config_estimate(monkeypatch):
    from engine.config import find_config, parse_yaml
    from workbench.run_time import estimate_run_time

    monkeypatch.setenv("TUNEBENCH_MATMUL_GFLOPS", "100")
    est = estimate_run_time(parse_yaml(find_config("demo/smollm2_135m_lora").read_text()))
    smollm2 = ModelShape(num_layers=30, dim=576, vocab_size=49152, intermediate_dim=1536, kv_dim=192)
    # 40 steps of 4 rows x 192 tokens; validation: 2 batches of 4 rows at steps 20 and 40
    fwd = forward_flops_per_token(smollm2, 192)
    per_step = 4 * 192 * 2 * fwd + 16 * 192 * fwd / 40
    assert (est.steps, est.tokens_per_step, est.device) == (40, 768, "cpu")
    assert est.flops_per_step == pytest.approx(per_step, rel=1e-12)
    assert est.seconds == pytest.approx(40 * per_step / 50e9, rel=1e-12)
