"""Peak CPU memory of the memory options, each case measured in a fresh subprocess.

    .venv/bin/python bench/memory_options.py            # all cases, prints a markdown table
    .venv/bin/python bench/memory_options.py --case lce_fused   # one case, prints one JSON line

Each case process builds its inputs, records its resident set, resets the Linux peak-RSS counter
(`/proc/self/clear_refs`), runs the work and reports `peak - baseline` (the memory the work itself
needed on top of its inputs) plus exact byte counts where the quantity is a set of tensors.

Cases (goals from issue 5):
- linear cross-entropy vs materialised logits, vocab 151,936, 4,096 tokens, D=128, fp32, all tokens
  in the loss (so dropping ignored tokens does not help LCE): fwd + bwd extra peak, goal <= 0.35x.
- optimizer-in-backward vs a normal AdamW step (24 x 1024x1024 linears, 25M params, 2nd step so the
  optimizer state already exists, foreach off on both sides): peak live gradient bytes (exact) and the
  step's extra peak RSS, goal >= 80% of gradient bytes saved.
- QLoRA: NF4 base weights (engine.modules.peft.LoRALinear, quantize_base=True) vs bf16, goal <= 0.3x.
- torchao AdamW8bit state vs torch AdamW state, goal <= 0.3x.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MIB = float(1 << 20)


def _mem_available_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1 << 20)
    return 0.0


class PeakWindow:
    """Baseline RSS at entry; `extra_mib` = peak RSS inside the window minus that baseline."""

    def __enter__(self):
        from engine.training.meters import reset_peak_memory, rss_bytes

        gc.collect()
        self.baseline = rss_bytes()
        reset_peak_memory("cpu")
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        from engine.training.meters import peak_rss_bytes

        self.seconds = time.perf_counter() - self.start
        self.extra_mib = (peak_rss_bytes() - self.baseline) / MIB


# ---- cases (each runs in its own process) -------------------------------------------------------
def _lce_inputs():
    import torch

    torch.manual_seed(0)
    n, d, v = 4096, 128, 151_936
    hidden = torch.randn(2, n // 2, d, requires_grad=True)  # [B, S, D]
    weight = (torch.randn(v, d) * 0.02).requires_grad_()  # [V, D]
    labels = torch.randint(0, v, (2, n // 2))  # [B, S]
    return hidden, weight, labels


def case_lce_materialised() -> dict:
    import torch.nn.functional as F

    hidden, weight, labels = _lce_inputs()
    with PeakWindow() as w:
        logits = hidden @ weight.t()  # [B, S, V] fp32, 2.5 GB
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
        loss.backward()
        del logits
    return {"extra_mib": w.extra_mib, "seconds": w.seconds, "loss": loss.item()}


def case_lce_fused() -> dict:
    from engine.modules.loss import LinearCrossEntropyLoss

    hidden, weight, labels = _lce_inputs()
    with PeakWindow() as w:
        loss = LinearCrossEntropyLoss()(hidden, weight, labels)  # default chunk_size=1024
        loss.backward()
    return {"extra_mib": w.extra_mib, "seconds": w.seconds, "loss": loss.item()}


class LiveGradBytes:
    """Largest total of `.grad` bytes alive at any post-accumulate-grad hook (exact tensor accounting).

    Registered before the optimizer-in-backward hooks, so it sees each gradient before it is freed.
    """

    def __init__(self, model):
        self.params = list(model.parameters())
        self.peak = 0
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, _param):
        live = sum(p.grad.numel() * p.grad.element_size() for p in self.params if p.grad is not None)
        self.peak = max(self.peak, live)


def _mlp_stack():
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(1024, 1024, bias=False) for _ in range(24)])
    x = torch.randn(64, 1024)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return model, x, grad_bytes


def case_opt_normal() -> dict:
    import torch

    model, x, grad_bytes = _mlp_stack()
    live = LiveGradBytes(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    with PeakWindow() as w:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {
        "extra_mib": w.extra_mib,
        "seconds": w.seconds,
        "grad_mib": grad_bytes / MIB,
        "live_grad_peak_mib": live.peak / MIB,
    }


def case_opt_in_backward() -> dict:
    import functools

    import torch

    from engine.training import setup_optimizer_in_backward

    model, x, grad_bytes = _mlp_stack()
    live = LiveGradBytes(model)
    opt = setup_optimizer_in_backward(model, functools.partial(torch.optim.AdamW, lr=1e-4, foreach=False))
    model(x).square().mean().backward()
    with PeakWindow() as w:
        model(x).square().mean().backward()
        opt.step()
    return {
        "extra_mib": w.extra_mib,
        "seconds": w.seconds,
        "grad_mib": grad_bytes / MIB,
        "live_grad_peak_mib": live.peak / MIB,
    }


def _settled_rss() -> int:
    """RSS after garbage collection and returning freed heap pages to the OS (glibc `malloc_trim`)."""
    import ctypes

    from engine.training.meters import rss_bytes

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    return rss_bytes()


def _tensor_bytes(t) -> int:
    if type(t).__name__ != "Tensor" and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, n)) for n in names)
    return t.untyped_storage().nbytes()


def _linears(quantize: bool):
    import torch
    from torch import nn

    from engine.modules.peft import LoRALinear

    torch.manual_seed(0)
    gc.collect()
    if quantize:
        layers = nn.ModuleList(
            LoRALinear(2048, 2048, rank=16, alpha=32, quantize_base=True) for _ in range(16)
        )
    else:
        layers = nn.ModuleList(nn.Linear(2048, 2048, bias=False).to(torch.bfloat16) for _ in range(16))
    return layers


def case_base_bf16() -> dict:
    before = _settled_rss()
    layers = _linears(quantize=False)
    held = (_settled_rss() - before) / MIB
    return {"base_mib": sum(_tensor_bytes(m.weight) for m in layers) / MIB, "rss_mib": held}


def case_base_nf4() -> dict:
    import torchao.quantization  # noqa: F401  (library code is not weight memory: load it first)

    _linears(quantize=True)  # warm-up: first-use allocations of torchao's NF4 path
    before = _settled_rss()
    layers = _linears(quantize=True)
    held = (_settled_rss() - before) / MIB
    adapters = sum(p.numel() * p.element_size() for p in layers.parameters() if p.requires_grad) / MIB
    return {
        "base_mib": sum(_tensor_bytes(m.weight) for m in layers) / MIB,
        "rss_mib": held,
        "adapter_mib": adapters,
    }


def _optimizer_state(kind: str) -> dict:
    import torch
    from torch import nn

    from engine.training import adamw_8bit, optimizer_state_bytes

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(2048, 2048, bias=False) for _ in range(4)])
    x = torch.randn(8, 2048)
    opt = (
        torch.optim.AdamW(model.parameters(), lr=1e-4) if kind == "adamw" else adamw_8bit(model.parameters())
    )
    model(x).square().mean().backward()
    with PeakWindow() as w:
        opt.step()
    return {"state_mib": optimizer_state_bytes(opt) / MIB, "seconds": w.seconds}


def case_adamw_state() -> dict:
    return _optimizer_state("adamw")


def case_adamw8bit_state() -> dict:
    return _optimizer_state("adamw8bit")


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def _run_case(name: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    proc = subprocess.run(
        [sys.executable, __file__, "--case", name], capture_output=True, text=True, env=env, timeout=600
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"case {name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), help="run one case in this process, print JSON")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(CASES[args.case]()))
        return
    if _mem_available_gib() < 12:
        raise SystemExit(
            f"only {_mem_available_gib():.1f} GiB available: the materialised-logits case needs ~9 GiB — retry later"
        )
    r = {name: _run_case(name) for name in CASES}
    lce = r["lce_fused"]["extra_mib"] / r["lce_materialised"]["extra_mib"]
    saved = (r["opt_normal"]["extra_mib"] - r["opt_in_backward"]["extra_mib"]) / r["opt_normal"]["grad_mib"]
    grad_saved = 1 - r["opt_in_backward"]["live_grad_peak_mib"] / r["opt_normal"]["live_grad_peak_mib"]
    nf4 = r["base_nf4"]["base_mib"] / r["base_bf16"]["base_mib"]
    nf4_rss = r["base_nf4"]["rss_mib"] / r["base_bf16"]["rss_mib"]
    adam = r["adamw8bit_state"]["state_mib"] / r["adamw_state"]["state_mib"]
    rows = [
        ("Linear CE vs materialised logits (V=151,936, 4,096 tokens, D=128, fp32, fwd+bwd extra peak RSS)",
         f"{r['lce_fused']['extra_mib']:.0f} vs {r['lce_materialised']['extra_mib']:.0f} MiB "
         f"({r['lce_fused']['seconds']:.1f} s vs {r['lce_materialised']['seconds']:.1f} s)",
         f"{lce:.2f}x", "<= 0.35x"),
        ("Optimizer-in-backward vs AdamW step (24 x 1024x1024, 25M params): peak live gradient bytes; step extra peak RSS",
         f"grads {r['opt_in_backward']['live_grad_peak_mib']:.0f} vs {r['opt_normal']['live_grad_peak_mib']:.0f} MiB; "
         f"RSS {r['opt_in_backward']['extra_mib']:.0f} vs {r['opt_normal']['extra_mib']:.0f} MiB",
         f"{grad_saved:.0%} of gradient bytes saved (RSS: {saved:.0%})", ">= 80%"),
        ("QLoRA NF4 base weights vs bf16 (16 x 2048x2048; tensor bytes / RSS)",
         f"{r['base_nf4']['base_mib']:.1f} vs {r['base_bf16']['base_mib']:.1f} MiB "
         f"(RSS {r['base_nf4']['rss_mib']:.0f} vs {r['base_bf16']['rss_mib']:.0f} MiB)",
         f"{nf4:.3f}x (RSS {nf4_rss:.2f}x)", "<= 0.3x"),
        ("torchao AdamW8bit state vs AdamW (4 x 2048x2048)",
         f"{r['adamw8bit_state']['state_mib']:.1f} vs {r['adamw_state']['state_mib']:.1f} MiB",
         f"{adam:.3f}x", "<= 0.3x"),
    ]  # fmt: skip
    print("| case | measured | ratio | goal |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\nraw: " + json.dumps(r))


if __name__ == "__main__":
    main()
