"""Throughput, memory and model-FLOPs-utilisation meters for the training loop.

Memory figures (GiB, per process = per rank):
- `mem_peak_gb`: CUDA peak allocated since the last `reset_peak_memory`; on CPU the process's peak
  resident set (Linux `VmHWM`, reset through `/proc/self/clear_refs`; `ru_maxrss` elsewhere).
- `mem_reserved_gb`: CUDA memory reserved by the caching allocator; on CPU the current resident set
  (what the process holds from the OS).
- `rss_gb`: the current resident set of the process, on any device.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time

import torch

GIB = float(1 << 30)


def _proc_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int:
    """Current resident set size of this process, in bytes."""
    kb = _proc_status_kb("VmRSS")
    if kb is not None:
        return kb * 1024
    import psutil

    return psutil.Process().memory_info().rss


def peak_rss_bytes() -> int:
    """Peak resident set size since start or the last `reset_peak_memory`, in bytes."""
    kb = _proc_status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak_memory(device: torch.device | str = "cpu") -> None:
    """Start a new peak window: CUDA peak stats, or the process peak RSS on Linux."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        pass  # not Linux or not permitted: the peak then covers the whole process life


def memory_stats(device: torch.device | str = "cpu") -> dict[str, float]:
    """`{"mem_peak_gb", "mem_reserved_gb", "rss_gb"}` for this process (see the module docstring)."""
    device = torch.device(device)
    rss = rss_bytes() / GIB
    if device.type == "cuda":
        return {
            "mem_peak_gb": torch.cuda.max_memory_allocated(device) / GIB,
            "mem_reserved_gb": torch.cuda.memory_reserved(device) / GIB,
            "rss_gb": rss,
        }
    return {"mem_peak_gb": peak_rss_bytes() / GIB, "mem_reserved_gb": rss, "rss_gb": rss}


def gpu_utilization(index: int = 0) -> float | None:
    """GPU busy percentage from NVML, or None when NVML or a GPU is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return float(pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(index)).gpu)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # pynvml raises its own NVMLError family without a driver
        return None


class ThroughputMeter:
    """Tokens per second between `step()` calls and the running total.

    `step(num_tokens)` returns `{"tokens_per_sec", "tokens_total"}` for the interval since the
    previous call (or since construction / `reset_clock()`).
    """

    def __init__(self, tokens_total: int = 0) -> None:
        self.tokens_total = int(tokens_total)
        self._last = time.perf_counter()

    def reset_clock(self) -> None:
        """Restart the interval (e.g. after a checkpoint save or validation)."""
        self._last = time.perf_counter()

    def step(self, num_tokens: int) -> dict[str, float]:
        now = time.perf_counter()
        elapsed = max(now - self._last, 1e-9)
        self._last = now
        self.tokens_total += int(num_tokens)
        return {"tokens_per_sec": num_tokens / elapsed, "tokens_total": float(self.tokens_total)}


def count_matmul_params(model: torch.nn.Module) -> int:
    """Parameters that take part in matmuls: all, minus embedding tables (a lookup, not a matmul),
    except an embedding tied to the output projection, which counts once."""
    out_weight = getattr(model, "output_weight", None)
    skip = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and module.weight is not out_weight:
            skip.add(id(module.weight))
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in seen or id(p) in skip:
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def model_flops_per_token(num_params: int, num_layers: int, dim: int, seq_len: int) -> float:
    """Training FLOPs per token: `6 N + 12 L D S` (forward + backward of the weights' matmuls, plus
    the attention scores and weighted sum, counted over the full S x S square as is conventional).

    Args:
        num_params: matmul parameters (`count_matmul_params`); dim: query width (heads x head_dim).
    """
    return 6.0 * num_params + 12.0 * num_layers * dim * seq_len


def measure_matmul_flops(
    dtype: torch.dtype = torch.float32,
    *,
    size: int = 1024,
    device: torch.device | str = "cpu",
    repeats: int = 10,
) -> float:
    """This machine's measured square-matmul rate in FLOP/s (median of `repeats`), the MFU denominator."""
    device = torch.device(device)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        torch.mm(a, b, out=out)
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        sync()
        times.append(time.perf_counter() - start)
    return 2.0 * size**3 / statistics.median(times)


def mfu(tokens_per_sec: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over `peak_flops` (a fraction, 0..1)."""
    return tokens_per_sec * flops_per_token / peak_flops
