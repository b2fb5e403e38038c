"""Meters: FLOPs formula against torch's FLOP counter, memory peaks against a known allocation."""

import json
import subprocess
import sys
import time

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from engine.training import (
    ThroughputMeter,
    count_matmul_params,
    gpu_utilization,
    measure_matmul_flops,
    mfu,
    model_flops_per_token,
)
from tests.engine.training.tiny_decoder import tiny_decoder


def test_flops_per_token_matches_torch_flop_counter():
    # Equal q and kv heads so the attention width equals dim; 4 layers, sequence 32.
    model = tiny_decoder(num_layers=4, num_heads=4, num_kv_heads=4)
    b, s = 2, 32
    tokens = torch.randint(0, 128, (b, s))
    # The math SDPA backend runs attention as bmm's, which the counter sees (the fused CPU kernel it does not).
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(tokens).float().logsumexp(-1).sum().backward()
    measured = counter.get_total_flops() / (b * s)
    n = count_matmul_params(model)
    assert n == sum(p.numel() for p in model.parameters()) - 128 * 64  # the embedding table is a lookup
    predicted = model_flops_per_token(n, num_layers=4, dim=64, seq_len=s)
    # 6N counts the RMSNorm weights too (576 here, 0.3% of N), which are elementwise, not matmuls.
    assert predicted == pytest.approx(measured, rel=0.01), (predicted, measured)


def test_matmul_rate_and_mfu():
    rate = measure_matmul_flops(torch.float32, size=256, repeats=3)
    assert rate > 1e8
    assert mfu(tokens_per_sec=1000.0, flops_per_token=2e6, peak_flops=4e9) == pytest.approx(0.5)


_PEAK_PROBE = """
import json, torch
from engine.training import memory_stats, reset_peak_memory
reset_peak_memory("cpu")
before = memory_stats("cpu")
block = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
during = memory_stats("cpu")
del block
after = memory_stats("cpu")
print(json.dumps({"before": before, "during": during, "after": after}))
"""


def test_cpu_memory_peak_sees_a_known_allocation():
    """In a fresh interpreter: once a recipe (or another test) has asked glibc to keep freed blocks
    (`keep_freed_memory`, process-wide), a new 64 MiB tensor reuses resident pages and RSS does not move."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK_PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    before, during, after = stats["before"], stats["during"], stats["after"]
    gib64 = 64 / 1024
    assert during["rss_gb"] - before["rss_gb"] >= 0.9 * gib64
    assert after["mem_peak_gb"] - before["rss_gb"] >= 0.9 * gib64  # the peak outlives the tensor
    assert set(after) == {"mem_peak_gb", "mem_reserved_gb", "rss_gb"}


def test_throughput_meter_and_guarded_nvml():
    meter = ThroughputMeter(tokens_total=100)
    time.sleep(0.05)
    out = meter.step(500)
    assert out["tokens_total"] == 600
    assert 0 < out["tokens_per_sec"] <= 500 / 0.05
    if not torch.cuda.is_available():
        assert gpu_utilization() is None
