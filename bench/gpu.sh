#!/usr/bin/env bash
# SFT training on one CUDA GPU (prepared for an H200; under 8 minutes):
#   bash bench/gpu.sh                    # figures to stdout and bench/out/gpu_sft.json
#   CASES=baseline,compile bash bench/gpu.sh
#   SMOKE=1 CASES=baseline,packing bash bench/gpu.sh   # tiny CPU run that checks the script only
#
# A Qwen3-0.6B-shaped model (random weights: speed does not depend on their values), bf16, sequences
# up to 2048 tokens, AdamW (fused), linear cross-entropy, the engine's own training step (decoder
# forward_hidden -> LinearCrossEntropyLoss -> backward -> optimizer step), as engine/recipes/sft.py runs it.
# Data: 4,096 synthetic instruction-like samples whose lengths follow a long-tailed distribution
# (median ~250 tokens, capped at 2048), loss on the second half of each sample.
#
# Throughput cases (tokens/s counts real, non-pad tokens):
#   baseline   padded batches of 8 samples (right padding to the longest)
#   compile    + torch.compile per block
#   packing    + compile + packed 2048-token sequences, 4 per batch (block-causal attention)
# Peak memory cases (packed, batch 4 x 2048, each relative to `packing`):
#   plain_ce   materialised [B,S,V] logits + cross-entropy instead of linear CE
#   ac         activation checkpointing on every block
#   opt_in_bwd optimizer step inside backward (no full gradient set)
#   adamw8bit  torchao AdamW8bit
#   offload    activation offloading to host memory
#   lora       LoRA rank 8 on q/k/v/o + MLP (frozen bf16 base)
#   qlora      the same with an NF4 base
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
export CASES="${CASES:-baseline,compile,packing,plain_ce,ac,opt_in_bwd,adamw8bit,offload,lora,qlora}"
mkdir -p bench/out
"$PY" - <<'PYEOF'
import contextlib, json, os, statistics, sys, time
import torch

sys.path.insert(0, os.getcwd())
from engine.data.collate import packed_collate, padded_collate
from engine.data.packing import PackedDataset
from engine.models.qwen3 import SIZES, lora_qwen3, qwen3
from engine.modules.loss import ChunkedCrossEntropyLoss, LinearCrossEntropyLoss
from engine.training import (ActivationOffloading, adamw_8bit, apply_activation_checkpointing,
                             setup_optimizer_in_backward)

# SMOKE=1: a tiny shape on CPU, to check the script itself where no GPU is lent (figures meaningless).
SMOKE = os.environ.get("SMOKE") == "1"
assert SMOKE or torch.cuda.is_available(), "bench/gpu.sh needs a CUDA device"
dev = torch.device("cpu" if SMOKE else "cuda")
VOCAB, SEQ = (256, 256) if SMOKE else (151_936, 2048)
if not SMOKE:
    torch.backends.cuda.matmul.allow_tf32 = True
else:
    torch.cuda.synchronize = lambda: None
    torch.cuda.reset_peak_memory_stats = lambda: None
    torch.cuda.max_memory_allocated = lambda: 0
    torch.cuda.empty_cache = lambda: None
    torch.cuda.get_device_name = lambda: "cpu (smoke)"
cases = os.environ["CASES"].split(",")


def samples(n=64 if SMOKE else 4096, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = (torch.distributions.LogNormal(3.5 if SMOKE else 5.5, 0.8).sample((n,)).clamp(16, SEQ)).long()
    out = []
    for length in lengths.tolist():
        toks = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
        labels = toks[1:] + [-100]
        labels[: length // 2] = [-100] * (length // 2)
        out.append({"tokens": toks, "labels": labels, "source_id": 0})
    return out


DATA = samples()
PACKED = PackedDataset(DATA, max_seq_len=SEQ)


def batches(packed, batch):
    src = PACKED if packed else DATA
    i = 0
    while True:
        rows = [src[(i + k) % len(src)] for k in range(batch)]
        i += batch
        b = packed_collate(rows) if packed else padded_collate(rows, pad_id=0)
        yield {k: v.to(dev, non_blocking=True) for k, v in b.items()}


def build(case):
    sizes = dict(SIZES["qwen3_tiny" if SMOKE else "qwen3_0_6b"], max_seq_len=SEQ)
    if SMOKE:
        sizes.update(embed_dim=128, num_kv_heads=4, head_dim=32)  # NF4 needs 16,384-element weights
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 directly (an NF4 base must not be cast)
    with torch.device(dev):
        if case in ("lora", "qlora"):
            model = lora_qwen3(**sizes, lora_attn_modules=("q_proj", "k_proj", "v_proj", "output_proj"),
                               apply_lora_to_mlp=True, lora_rank=8, lora_alpha=16.0,
                               quantize_base=case == "qlora")
        else:
            model = qwen3(**sizes)
    torch.set_default_dtype(torch.float32)
    if case in ("lora", "qlora"):
        for n, p in model.named_parameters():
            p.requires_grad_("lora_" in n)
    if case == "ac":
        apply_activation_checkpointing(model, every_k=1)
    if case != "baseline":
        for block in model.layers:
            block.compile()
    return model


def run(case, steps=2 if SMOKE else 12, warmup=1 if SMOKE else 4):
    model = build(case)
    packed = case not in ("baseline", "compile")
    data = batches(packed, 4 if packed else 8)
    params = [p for p in model.parameters() if p.requires_grad]
    if case == "opt_in_bwd":
        opt = setup_optimizer_in_backward(model, lambda ps: torch.optim.AdamW(ps, lr=1e-5, fused=True))
    elif case == "adamw8bit":
        opt = adamw_8bit(params, lr=1e-5)
    else:
        opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    lce, ce = LinearCrossEntropyLoss(reduction="sum"), ChunkedCrossEntropyLoss(reduction="sum")
    offload = ActivationOffloading(model) if case == "offload" else None
    times, tokens = [], []
    torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + steps):
        b = next(data)
        torch.cuda.synchronize(); t0 = time.perf_counter()
        n = (b["labels"] != -100).sum().clamp(min=1)
        kw = {"position_ids": b["position_ids"], "document_ids": b.get("document_ids")}
        with offload if offload is not None else contextlib.nullcontext():
            if case == "plain_ce":
                loss = ce(model(b["tokens"], **kw), b["labels"]) / n
            else:
                loss = lce(model.forward_hidden(b["tokens"], **kw), model.output_weight, b["labels"]) / n
        loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            tokens.append(int((b["source_ids"] >= 0).sum()))
    tps = sum(tokens) / sum(times)
    res = {"case": case, "tokens_per_sec": tps, "step_s_median": statistics.median(times),
           "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30}
    print(json.dumps(res), flush=True)
    del model, opt
    torch.cuda.empty_cache()
    return res


t_start = time.time()
print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
results = [run(c) for c in cases]
json.dump({"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "results": results},
          open("bench/out/gpu_sft.json", "w"), indent=2)
print(f"total {time.time() - t_start:.0f} s")
PYEOF
