"""The mesh-aware memory estimate and the 70B plans, against bytes computed by hand.

Llama 3.3 70B (80 layers, D 8192, 64 heads / 8 kv heads of 128, F 28672, V 128256, untied):
  embeddings 2 * 128256 * 8192                                      =  2,101,346,304
  per layer  8192*8192 (q) + 2*8192*1024 (k, v) + 8192*8192 (o) + 3*8192*28672 (MLP) = 855,638,016
  80 layers                                                         = 68,451,041,280
  norms      (2 * 80 + 1) * 8192                                    =      1,318,912
  total                                                             = 70,553,706,496
"""

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

P_70B = 70_553_706_496
V, D, L, F = 128_256, 8192, 80, 28_672
GPU_80GB = 80 * GiB  # "80 GB" H100/A100 (nvidia-smi reports 81,559 MiB = 79.6 GiB usable; checked too)
GPU_80GB_USABLE = 81_559 * 2**20
SHAPE_70B = ModelShape(
    num_layers=L, dim=D, vocab_size=V, intermediate_dim=F, kv_dim=1024, q_dim=8192, tied_embeddings=False
)


def _estimate_config(name: str, nproc: int, **changes):
    from workbench.services import estimate_config

    cfg = load_config(f"configs/llama3_3/{name}.yaml")
    cfg.update(changes)
    return estimate_config(cfg, nproc, overhead=True)


def _hand_70b_full(*, nproc: int, batch: int, seq: int, in_backward: bool) -> float:
    """Per-rank bytes of the 70B full fine-tune: bf16 weights/gradients/AdamW states sharded over
    `nproc`, AC on every layer, linear CE in 1024-token chunks, 0.75 GiB CUDA overhead."""
    weights = P_70B * 2 / nproc
    gradients = (V * D * 2 if in_backward else P_70B * 2) / nproc  # one gradient alive: the embedding
    adamw = P_70B * 2 * 2 / nproc
    tokens = batch * seq
    saved_inputs = L * tokens * D * 2  # one [B,S,D] bf16 input per checkpointed layer
    one_layer = (2 * D + (D + 2 * 1024) + 2 * D + 4 * F) * tokens * 2  # the layer being recomputed
    logits = 1024 * V * (2 + 4 + 4)  # one chunk: bf16 logits, fp32 upcast, its gradient
    return weights + gradients + adamw + saved_inputs + one_layer + logits + 0.75 * GiB


def test_70b_param_count_matches_hand_sum():
    assert SHAPE_70B.num_params == 2_101_346_304 + 68_451_041_280 + 1_318_912 == P_70B


def test_70b_full_fits_on_8x80gb_only_with_optimizer_in_backward():
    with_oib = _estimate_config("70B_full", 8)
    without = _estimate_config("70B_full", 8, optimizer_in_bwd=False, clip_grad_norm=1.0)
    want_with = _hand_70b_full(nproc=8, batch=3, seq=4096, in_backward=True)
    want_without = _hand_70b_full(nproc=8, batch=3, seq=4096, in_backward=False)
    assert with_oib.total_bytes == pytest.approx(want_with, rel=1e-9)  # 70.1 GiB
    assert without.total_bytes == pytest.approx(want_without, rel=1e-9)  # 86.3 GiB
    assert with_oib.fits(GPU_80GB) and with_oib.fits(GPU_80GB_USABLE)
    assert without.fits(GPU_80GB) is False
    assert with_oib.total_params == P_70B


def test_70b_two_node_plan_fits_without_optimizer_in_backward():
    est = _estimate_config("70B_2node_full", 16)
    assert est.total_bytes == pytest.approx(_hand_70b_full(nproc=16, batch=4, seq=4096, in_backward=False))
    assert est.fits(GPU_80GB_USABLE)  # 59.6 GiB
    one_node = _estimate_config("70B_2node_full", 8)  # the same config on one node does not fit
    assert one_node.fits(GPU_80GB) is False


def test_70b_lora_plan_fits():
    est = _estimate_config("70B_lora", 8)
    lora = L * 16 * ((D + 8192) + (D + 1024) + (8192 + D) + 3 * (D + F))  # q, v, o, MLP adapters
    assert est.trainable_params == lora == 195_297_280
    assert est.gradients_bytes == pytest.approx(lora * 2 / 8)
    assert est.fits(GPU_80GB_USABLE)  # 31 GiB


SMALL = ModelShape(
    num_layers=4, dim=256, vocab_size=1000, intermediate_dim=512, kv_dim=128, tied_embeddings=False
)


def test_mesh_divides_weights_by_tp_and_shard_not_by_replicas():
    base = estimate_memory(SMALL, TrainingOptions(nproc=1))
    fsdp4 = estimate_memory(SMALL, TrainingOptions(nproc=4))
    hsdp = estimate_memory(SMALL, TrainingOptions(nproc=8, dp_replicate=2))  # 2 replicas x 4 shards
    tp2 = estimate_memory(SMALL, TrainingOptions(nproc=4, tp=2))  # 2 shards x 2 tp
    cp2 = estimate_memory(SMALL, TrainingOptions(nproc=4, cp=2))  # 2 shards x 2 cp: FSDP over 4
    p = SMALL.num_params
    assert base.weights_bytes == p * 2
    for est in (fsdp4, hsdp, tp2, cp2):
        assert est.weights_bytes == pytest.approx(p * 2 / 4)
        assert est.optimizer_bytes == pytest.approx(p * 4 / 4)
    assert hsdp.activations_bytes == base.activations_bytes  # batch is per data-parallel rank
    assert tp2.activations_bytes == pytest.approx(base.activations_bytes / 2)


def test_context_parallel_splits_the_sequence():
    opts = dict(seq_len=4096, batch_size=1)
    one = estimate_memory(SMALL, TrainingOptions(nproc=1, **opts))
    half_seq = estimate_memory(SMALL, TrainingOptions(nproc=1, batch_size=1, seq_len=2048))
    cp2 = estimate_memory(SMALL, TrainingOptions(nproc=2, cp=2, **opts))
    assert cp2.activations_bytes == pytest.approx(half_seq.activations_bytes)
    assert cp2.activations_bytes < one.activations_bytes
    assert any("mesh 1 x 1 x 2 x 1" in n for n in cp2.notes)


def test_degrees_that_do_not_divide_the_world_are_refused_in_one_line():
    with pytest.raises(MemoryEstimateError, match=r"nproc 6: .*tensor_parallel_dim = 4 must divide it"):
        TrainingOptions(nproc=6, tp=4)


def test_config_mesh_keys_reach_the_estimate():
    from workbench.recipe_options import training_options

    cfg = load_config("configs/llama3_3/70B_full.yaml")
    cfg.update(tensor_parallel_dim=2, context_parallel_dim=2, data_parallel_replicate_dim=2)
    opts = training_options(cfg, 16)
    assert (opts["tp"], opts["cp"], opts["dp_replicate"]) == (2, 2, 2)
    assert TrainingOptions(**opts).dp_shard == 2
