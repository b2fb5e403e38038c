"""Estimate how long a fine-tuning run takes on this machine before launching it.

Compute time = training FLOPs of the run / (this machine's measured matmul rate x `EFFICIENCY`):

- FLOPs per token (forward): 2 per multiply-add of every linear a token passes through (q, k, v,
  o, the MLP or its `experts_per_token` experts and the router, and the output projection), plus
  causal attention, 2 x `seq_len` x `q_dim` per layer (scores and the weighted sum over `seq_len / 2`
  keys on average). The backward pass costs 2 forwards for a full fine-tune (gradients of the inputs
  and of the weights) and 1 for LoRA/QLoRA (the frozen weights need no gradient; the adapters' are
  negligible); activation checkpointing recomputes 1 more forward.
- Tokens per optimizer step: batch x accumulation x data-parallel ranks x `seq_len`: every row
  counted at the full `seq_len`, an upper bound for unpacked rows (padded to the longest row of
  their batch only).
- The matmul rate: a `MATMUL_SHAPE` product timed for ~0.3 s on the run's device and dtype, cached for
  a day in `TUNEBENCH_HOME/cache/matmul_rate.json` (the probe reads the machine as it is, load
  included). `TUNEBENCH_MATMUL_GFLOPS` sets it instead (planning for another machine, or tests).
- `EFFICIENCY`: the share of the probe's rate a training step is taken to reach. Norms, softmax,
  the optimizer and the Python loop count against it; rows shorter than `seq_len` count for it (they
  are counted at full length), so it is not bounded by 1. 0.5 is a round figure, not fitted to a
  measurement; docs/BENCHMARKS.md "Demo" sets the demo config's estimates against two measured runs
  (13.6 min estimated, 15.8 measured; 72 min estimated, ~31 measured under load 12-17).

Start-up (loading the model and tokenising the data) is not included; the estimate says so.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from engine.training.memory_estimate import MemoryEstimateError, ModelShape

EFFICIENCY = 0.5
MATMUL_SHAPE = (512, 1024, 1024)  # (m, k, n): a token block times a mid-sized weight
PROBE_SECONDS = 0.3
CACHE_SECONDS = 24 * 3600.0  # a cached probe older than a day is measured again


@dataclass(frozen=True)
class TimeEstimate:
    """`steps` (optimizer steps; None when the run's length is unknown), `tokens_per_step`,
    `flops_per_step` (validation included, spread over the steps), `matmul_flops` (FLOP/s of the
    probe), `device`, `source` (where the rate came from: "measured <time>", "cached <time>" or
    "TUNEBENCH_MATMUL_GFLOPS"), `efficiency`."""

    steps: int | None
    tokens_per_step: int
    flops_per_step: float
    matmul_flops: float
    device: str
    source: str
    efficiency: float = EFFICIENCY

    @property
    def seconds_per_step(self) -> float:
        return self.flops_per_step / (self.matmul_flops * self.efficiency)

    @property
    def seconds(self) -> float | None:
        """Compute time of the whole run (None when `steps` is unknown)."""
        return None if self.steps is None else self.steps * self.seconds_per_step

    def summary(self) -> str:
        """One line: `~6 min for 40 steps on cpu (estimate; start-up not included)`."""
        if self.seconds is None:
            return f"~{format_seconds(self.seconds_per_step)} per step on {self.device} (estimate; steps unknown)"
        return (
            f"~{format_seconds(self.seconds)} for {self.steps} steps on {self.device} "
            "(estimate; start-up not included)"
        )

    def detail(self) -> str:
        """How the figure was made, in one line."""
        return (
            f"{self.flops_per_step / 1e9:,.0f} GFLOP/step over {self.matmul_flops / 1e9:,.1f} GFLOP/s matmul "
            f"({self.source}) x {self.efficiency:g} efficiency; rows counted at full length"
        )


def format_seconds(seconds: float) -> str:
    """`42 s`, `6 min`, `1.5 h`."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def forward_flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """FLOPs of one token's forward pass at context `seq_len` (see the module docstring)."""
    d, f = shape.dim, shape.intermediate_dim
    if shape.num_experts:
        mlp = max(1, shape.experts_per_token) * 3 * d * f + shape.num_experts * d  # experts + router
    else:
        mlp = 3 * d * f
    linears = shape.num_layers * (shape.attention_params_per_layer + mlp) + shape.vocab_size * d
    attention = shape.num_layers * 2 * seq_len * shape.q_dim
    return 2.0 * linears + attention


def train_flops_per_token(
    shape: ModelShape, *, method: str, seq_len: int, activation_checkpointing: bool = False
) -> float:
    """Forward + backward (+ recompute) FLOPs per trained token. `method`: full, lora or qlora."""
    if method not in ("full", "lora", "qlora"):
        raise MemoryEstimateError(f"method: {method!r} is not full, lora or qlora")
    backward = 2.0 if method == "full" else 1.0
    return forward_flops_per_token(shape, seq_len) * (
        1.0 + backward + (1.0 if activation_checkpointing else 0.0)
    )


def estimate_time(
    shape: ModelShape,
    *,
    method: str,
    seq_len: int,
    rows_per_step: int,
    steps: int | None,
    matmul_flops: float,
    device: str,
    source: str,
    activation_checkpointing: bool = False,
    validation_rows: int = 0,
) -> TimeEstimate:
    """The estimate for `steps` optimizer steps of `rows_per_step` rows of `seq_len` tokens (all
    ranks together; `matmul_flops` is the whole device's rate, so several ranks on one CPU share it).
    `validation_rows`: rows scored forward-only over the whole run (their cost is spread over the steps).
    """
    if seq_len < 1 or rows_per_step < 1:
        raise MemoryEstimateError("seq_len and rows per step must be positive")
    if matmul_flops <= 0:
        raise MemoryEstimateError("the matmul rate must be positive")
    tokens = rows_per_step * seq_len
    per_step = tokens * train_flops_per_token(
        shape, method=method, seq_len=seq_len, activation_checkpointing=activation_checkpointing
    )
    if validation_rows and steps:
        per_step += validation_rows * seq_len * forward_flops_per_token(shape, seq_len) / steps
    return TimeEstimate(steps, tokens, per_step, matmul_flops, device, source)


def steps_of_run(
    *, rows: int | None, rows_per_step: int, epochs: int, max_steps_per_epoch: int | None
) -> int | None:
    """Optimizer steps of a run: `epochs` x (the epoch's steps, capped at `max_steps_per_epoch`).
    The epoch's steps come from `rows` (training rows) when known; else only the cap counts (None
    when neither is known). A last partial batch counts as a step."""
    per_epoch = math.ceil(rows / rows_per_step) if rows else None
    if max_steps_per_epoch:
        per_epoch = min(per_epoch, max_steps_per_epoch) if per_epoch else max_steps_per_epoch
    return None if per_epoch is None else max(1, epochs) * per_epoch


def _cache_path(home: Path | None) -> Path:
    from engine.tracking.paths import tunebench_home

    return Path(home or tunebench_home()).expanduser() / "cache" / "matmul_rate.json"


def matmul_rate(
    device: str = "cpu", dtype: str = "fp32", *, home: Path | None = None, refresh: bool = False
) -> tuple[float, str]:
    """`(FLOP/s, source)` of a `MATMUL_SHAPE` matmul on `device` in `dtype` (fp32 / bf16), from
    `TUNEBENCH_MATMUL_GFLOPS`, the day-old cache under `home` (default `TUNEBENCH_HOME`), or a fresh
    ~0.3 s probe (then cached, written to a temp file and renamed). Raises `MemoryEstimateError` for
    a bad `TUNEBENCH_MATMUL_GFLOPS`."""
    planned = os.environ.get("TUNEBENCH_MATMUL_GFLOPS")
    if planned:
        try:
            value = float(planned)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise MemoryEstimateError(
                f"TUNEBENCH_MATMUL_GFLOPS={planned!r} is not a positive number of GFLOP/s; set e.g. 150 or unset it"
            )
        return value * 1e9, "TUNEBENCH_MATMUL_GFLOPS"
    import torch

    threads = torch.get_num_threads() if device == "cpu" else 0
    key = f"{device}:{dtype}:{threads}"
    path = _cache_path(home)
    cached: dict = {}
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    entry = cached.get(key) if isinstance(cached, dict) else None
    now = time.time()
    if not refresh and isinstance(entry, dict) and now - float(entry.get("time", 0)) < CACHE_SECONDS:
        stamp = time.strftime("%H:%M", time.localtime(float(entry["time"])))
        return float(entry["flops"]), f"cached {stamp}"
    flops = probe_matmul(device, dtype)
    cached = cached if isinstance(cached, dict) else {}
    cached[key] = {"flops": flops, "time": now, "shape": list(MATMUL_SHAPE)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(cached, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable home: the figure is still good for this estimate
    return flops, f"measured {time.strftime('%H:%M', time.localtime(now))}"


def probe_matmul(device: str = "cpu", dtype: str = "fp32", seconds: float = PROBE_SECONDS) -> float:
    """FLOP/s of repeated `MATMUL_SHAPE` products on `device` for about `seconds` (after one warm-up)."""
    import torch

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(
        dtype, torch.float32
    )
    m, k, n = MATMUL_SHAPE
    a = torch.randn(m, k, device=device, dtype=torch_dtype)
    b = torch.randn(k, n, device=device, dtype=torch_dtype)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    a @ b
    sync()
    count, start = 0, time.perf_counter()
    while True:
        a @ b
        count += 1
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * m * k * n * count / elapsed
