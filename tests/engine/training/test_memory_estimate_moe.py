"""Memory estimates of the MoE SFT configs on one node of 8 x 80 GB with expert parallelism, checked
against bytes computed here by hand from the published shapes."""

from __future__ import annotations

import pytest

from engine.config import load_config
from engine.training.memory_estimate import (
    GiB,
    MemoryEstimateError,
    ModelShape,
    TrainingOptions,
    estimate_memory,
)

pytest.importorskip("textual")  # the workbench's config -> options reader


def _estimate(name: str, nproc: int = 8):
    from workbench.services import estimate_config

    return estimate_config(load_config(f"configs/{name}.yaml"), nproc, recipe="sft")


def test_qwen3_moe_30b_a3b_lora_per_rank_bytes_by_hand():
    D, L, V, Q, KV, F, E, K = 2048, 48, 151_936, 32 * 128, 4 * 128, 768, 128, 8
    attention = D * Q + 2 * D * KV + Q * D  # q, k, v, o
    experts = E * 3 * D * F  # per layer
    total = 2 * V * D + L * (attention + experts + E * D) + (2 * L + 1) * D
    lora = L * 16 * ((D + Q) + 2 * (D + KV) + (Q + D))  # rank 16 on q, k, v, o
    dense_part = (total - L * experts + lora) * 2 / 8  # bf16, FSDP2 over 8 ranks
    expert_part = L * experts * 2 / 8  # bf16, 16 of 128 experts per rank (ep = 8)
    tokens = 1 * 2048
    saved = 2 * D + (Q + 2 * KV) + 2 * Q + K * (4 * F + 2 * D) + 4 * E  # one layer, per token
    activations = L * tokens * D * 2 + saved * tokens * 2 + 1024 * V * (2 + 4 + 4)  # AC + linear CE chunk

    est = _estimate("qwen3_moe/30B_A3B_lora")
    assert est.total_params == total == 30_532_110_336  # the card's 30,532,122,624 less q/k norms
    assert est.trainable_params == lora
    assert est.weights_bytes == pytest.approx(dense_part + expert_part, rel=1e-12)
    assert est.gradients_bytes == pytest.approx(lora * 2 / 8, rel=1e-12)
    assert est.optimizer_bytes == pytest.approx(lora * 4 / 8, rel=1e-12)  # AdamW: 2 bf16 states
    assert est.activations_bytes == pytest.approx(activations, rel=1e-12)
    assert 9.0 < est.total_bytes / GiB < 9.5 and est.fits(80e9)
    assert any("16 of 128 experts per rank" in n for n in est.notes)


def test_mixtral_8x7b_lora_per_rank_bytes_by_hand():
    D, L, V, Q, KV, F, E, K = 4096, 32, 32_000, 4096, 1024, 14_336, 8, 2
    attention = D * Q + 2 * D * KV + Q * D
    experts = E * 3 * D * F
    total = 2 * V * D + L * (attention + experts + E * D) + (2 * L + 1) * D
    assert total == 46_702_792_704  # the published count
    lora = L * 16 * ((D + Q) + 2 * (D + KV) + (Q + D))
    weights = (total - L * experts + lora) * 2 / 8 + L * experts * 2 / 8  # one expert per rank
    est = _estimate("mixtral/8x7B_lora")
    assert est.weights_bytes == pytest.approx(weights, rel=1e-12)
    tokens = 2048
    saved = 2 * D + (Q + 2 * KV) + 2 * Q + K * (4 * F + 2 * D) + 4 * E
    assert est.activations_bytes == pytest.approx(
        L * tokens * D * 2 + saved * tokens * 2 + 1024 * V * 10, rel=1e-12
    )
    assert est.fits(80e9) and 10.8 < est.weights_bytes / GiB < 11.0


def test_full_finetune_qwen3_moe_235b_does_not_fit_without_more_ranks():
    """Full fine-tuning: experts' gradients and AdamW states are split over ep ranks like the weights."""
    shape = ModelShape(
        num_layers=94, dim=4096, vocab_size=151_936, intermediate_dim=1536, kv_dim=512, q_dim=8192,
        tied_embeddings=False, num_experts=128, experts_per_token=8,
    )  # fmt: skip
    est = estimate_memory(shape, TrainingOptions(method="full", nproc=8, ep=8, activation_checkpointing=True))
    per_param = 2 + 2 + 4  # bf16 weight, bf16 gradient, two bf16 AdamW states
    assert est.weights_bytes + est.gradients_bytes + est.optimizer_bytes == pytest.approx(
        shape.num_params * per_param / 8, rel=1e-12
    )
    assert not est.fits(80e9)  # ~219 GiB per rank of state alone


def test_expert_parallel_on_a_dense_model_is_refused():
    with pytest.raises(MemoryEstimateError, match="ep: expert parallelism needs a mixture-of-experts"):
        estimate_memory(ModelShape(num_layers=2, dim=64, vocab_size=128), TrainingOptions(nproc=2, ep=2))
