"""MoE training step: tunebench's Qwen3-MoE against transformers' on the same random weights and tokens.

    nice .venv/bin/python bench/moe_step.py            # figures to stdout and bench/out/moe_step.json
    SMOKE=1 .venv/bin/python bench/moe_step.py         # a tiny shape, 2 rounds: checks the script only
    THREADS=1 ... / PROFILE=1 ...                        # torch threads; print each side's top ops too

On a CPU shared with other work use `THREADS=1`: with 2 threads every GEMM waits at OpenMP barriers
for a core another process holds, and a step's time then moves 10x with the machine load.

One training step = forward, cross-entropy + router_aux_loss_coef x load-balancing loss, backward,
AdamW step, in fp32 on the CPU (`DEVICE=cuda DTYPE=bf16`: on a GPU, as bench/gpu.sh's moe case). Shape: a small Qwen3-MoE (8 experts,
top-2, 2 layers, hidden 256, expert hidden 512, vocab 8192 or `VOCAB`), batch 4 x 256 tokens. Both models start
from the same weights (transformers' random init, loaded into ours through its HF folder) and see
the same tokens; runs alternate (theirs, ours, theirs, ...) so machine load hits both alike; each
side reports its median step time (wall, and process CPU time, which moves less with machine load). transformers is timed with its default experts implementation
and with `experts_implementation="eager"` (its per-expert Python loop).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from data_pipeline import _cpu_flags  # noqa: E402  (bench/ is this script's folder: one CPU line for all)

SMOKE = os.environ.get("SMOKE") == "1"
DEVICE = torch.device(os.environ.get("DEVICE", "cpu"))
DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16}[os.environ.get("DTYPE", "fp32")]
ROUNDS = 2 if SMOKE else int(os.environ.get("ROUNDS", "15"))
WARMUP = 1 if SMOKE else 3
SHAPE = dict(
    vocab_size=512 if SMOKE else int(os.environ.get("VOCAB", "8192")),  # smaller: the MoE blocks weigh more
    hidden_size=64 if SMOKE else 256,
    moe_intermediate_size=32 if SMOKE else 512,
    intermediate_size=1024,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16 if SMOKE else 64,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    max_position_embeddings=512,
    router_aux_loss_coef=0.01,
    tie_word_embeddings=False,
)
BATCH, SEQ = (2, 32) if SMOKE else (4, 256)
PROFILE = os.environ.get("PROFILE") == "1"
if os.environ.get("THREADS"):
    torch.set_num_threads(int(os.environ["THREADS"]))


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    import transformers

    from engine.models import from_pretrained
    from engine.modules.moe import moe_aux_loss

    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(**SHAPE)
    with tempfile.TemporaryDirectory() as tmp:
        reference = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for p in reference.parameters():
                p.normal_(0.0, 0.02)  # the router starts at zero in transformers' init: give it weights
        reference.save_pretrained(tmp)
        theirs = {
            "transformers": transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=DTYPE),
            "transformers_eager": transformers.AutoModelForCausalLM.from_pretrained(
                tmp, dtype=DTYPE, experts_implementation="eager"
            ),
        }
        ours = from_pretrained(tmp, dtype=DTYPE)
    coef = SHAPE["router_aux_loss_coef"]
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, SHAPE["vocab_size"], (BATCH, SEQ), generator=gen).to(DEVICE)
    # Next-token labels as transformers shifts them (the last position ignored): no sliced logits copy.
    labels = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], -100)], dim=1).reshape(-1)

    def hf_step(model, opt):
        out = model(tokens, labels=tokens, output_router_logits=True)  # CE + coef * aux, as they train
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss

    def our_step(model, opt):
        logits = model(tokens)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels, ignore_index=-100)
        loss = ce + coef * moe_aux_loss(model)[0]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    runs = {name: (m.to(DEVICE).train(), hf_step) for name, m in theirs.items()}
    runs["tunebench"] = (ours.to(DEVICE).train(), our_step)
    optims = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True) for name, (m, _) in runs.items()}
    first = {}
    for name, (model, step) in runs.items():  # the same first-step loss: same weights, same tokens
        first[name] = float(step(model, optims[name]).detach())
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}  # process CPU time: moves less with load
    for r in range(WARMUP + ROUNDS):
        for name, (model, step) in runs.items():  # alternating, every round
            _sync()
            t0, c0 = time.perf_counter(), time.process_time()
            step(model, optims[name])
            _sync()
            if r >= WARMUP:
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    if PROFILE:  # one profiled step each: where the time goes, by op (self time)
        from torch.profiler import ProfilerActivity, profile

        for name, (model, step) in runs.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step(model, optims[name])
            print(f"--- {name}: one step, top ops by self time")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    tokens_per_step = BATCH * SEQ
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "device": str(DEVICE),
        "dtype": str(DTYPE),
        "cpu": _cpu_flags(),
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "shape": SHAPE,
        "batch": [BATCH, SEQ],
        "rounds": ROUNDS,
        "first_step_loss": first,
        "median_s": {n: statistics.median(t) for n, t in times.items()},
        "tokens_per_s": {n: tokens_per_step / statistics.median(t) for n, t in times.items()},
        "median_cpu_s": {n: statistics.median(t) for n, t in cpu.items()},
    }
    med = result["median_s"]
    result["speedup_vs_transformers"] = med["transformers"] / med["tunebench"]
    result["speedup_vs_transformers_eager"] = med["transformers_eager"] / med["tunebench"]
    cpu_med = result["median_cpu_s"]
    result["cpu_time_speedup_vs_transformers"] = cpu_med["transformers"] / cpu_med["tunebench"]
    result["cpu_time_speedup_vs_transformers_eager"] = cpu_med["transformers_eager"] / cpu_med["tunebench"]
    print(f"cpu: {result['cpu']} | threads {result['threads']} | load {result['load_average']}")
    for name in runs:
        print(f"{name:<20} median {med[name] * 1e3:8.1f} ms/step  {result['tokens_per_s'][name]:9.0f} tokens/s  "
              f"first loss {first[name]:.6f}")  # fmt: skip
    print(f"tunebench / transformers (default experts): {result['speedup_vs_transformers']:.2f}x; "
          f"/ transformers eager: {result['speedup_vs_transformers_eager']:.2f}x; CPU time: "
          f"{result['cpu_time_speedup_vs_transformers']:.2f}x / "
          f"{result['cpu_time_speedup_vs_transformers_eager']:.2f}x")  # fmt: skip
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / ("moe_step_smoke.json" if SMOKE else "moe_step.json")).write_text(
        json.dumps(result, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
