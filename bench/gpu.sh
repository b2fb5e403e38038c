#!/usr/bin/env bash
# SFT training figures on one CUDA GPU, in one run (prepared for an H200: about 6-8 minutes):
#   bash bench/gpu.sh                      # both tables to stdout, JSON to bench/out/gpu_sft.json
#   ROWS=llama:baseline,qwen:compile bash bench/gpu.sh     # some rows only (table:row,...)
#   SMOKE=1 bash bench/gpu.sh              # tiny shapes on CPU: checks the script where no GPU is lent
#
# Table 1, torchtune's published A100 table (torchtune 0.6.1 README: Llama 3.2 3B, batch 2, sequences
# of 4096, bf16, full_finetune_single_device; each row adds to the previous one, LoRA/QLoRA keep the
# rows up to offloading but use plain AdamW without optimizer-in-backward):
#   baseline, +packing, +compile, +linear CE (torchtune: chunked CE), +AC, +optimizer-in-backward,
#   +activation offloading, +AdamW8bit, LoRA (rank 64 on q/v/o + MLP, as torchtune's
#   3B_lora_single_device), QLoRA (the same with an NF4 base).
# Table 2, the seed's Qwen3-0.6B figures (H100: 5.2k tok/s -> 7.9k with compile -> 57k with packing):
#   baseline (padded batches of 8), +compile, +packing (4 x 2048 packed).
# Random weights (speed and memory do not depend on their values). Data: synthetic instruction-like
# samples with a long-tailed length distribution (median ~250 tokens), loss on the second half of each;
# tokens/s counts real (non-pad) tokens; peak GiB is torch.cuda.max_memory_allocated over the row.
# The training step is the engine's own (decoder -> loss -> backward -> optimizer step), as sft.py runs it.
# Table 3, MoE (row moe:step): bench/moe_step.py in bf16 on the GPU, tunebench's Qwen3-MoE step (grouped
# GEMM) against transformers' on the same weights and tokens (SMOKE=1: its tiny CPU shape).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
mkdir -p bench/out
"$PY" - <<'PYEOF'
import contextlib, json, os, statistics, sys, time
import torch

sys.path.insert(0, os.getcwd())
from engine.data.collate import packed_collate, padded_collate
from engine.data.packing import PackedDataset
from engine.models import llama3, qwen3
from engine.modules.loss import ChunkedCrossEntropyLoss, LinearCrossEntropyLoss
from engine.training import (ActivationOffloading, adamw_8bit, apply_activation_checkpointing,
                             setup_optimizer_in_backward)

# SMOKE=1: tiny shapes on CPU, compile with the eager backend (dynamo traces, no C++ build), rows with
# activation offloading run without it (it needs CUDA; the row says so); the figures mean nothing, the
# rows and the code paths are what it checks.
SMOKE = os.environ.get("SMOKE") == "1"
if not SMOKE and not torch.cuda.is_available():
    sys.exit("bench/gpu.sh: needs a CUDA device (SMOKE=1 checks the script on CPU)")
DEV = torch.device("cpu" if SMOKE else "cuda")
if not SMOKE:
    torch.backends.cuda.matmul.allow_tf32 = True


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def reset_peak():
    if DEV.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib():
    return torch.cuda.max_memory_allocated() / 2**30 if DEV.type == "cuda" else float("nan")


FULL = dict(packed=False, compile=False, lce=False, ac=False, oib=False, offload=False, optim="adamw", method="full")
LLAMA_ROWS = [  # (row, options, torchtune's A100 figures: peak GiB, tokens/s)
    ("baseline", {}, (25.5, 2091)),
    ("+packing", dict(packed=True), (60.0, 7075)),
    ("+compile", dict(packed=True, compile=True), (51.0, 8998)),
    ("+linear CE", dict(packed=True, compile=True, lce=True), (42.9, 9174)),
    ("+AC", dict(packed=True, compile=True, lce=True, ac=True), (24.9, 7210)),
    ("+opt-in-bwd", dict(packed=True, compile=True, lce=True, ac=True, oib=True), (23.1, 7309)),
    ("+offloading", dict(packed=True, compile=True, lce=True, ac=True, oib=True, offload=True), (21.8, 7301)),
    ("+AdamW8bit", dict(packed=True, compile=True, lce=True, ac=True, oib=True, offload=True, optim="adamw8bit"),
     (17.6, 6960)),
    ("LoRA", dict(packed=True, compile=True, lce=True, ac=True, offload=True, method="lora"), (8.5, 8210)),
    ("QLoRA", dict(packed=True, compile=True, lce=True, ac=True, offload=True, method="qlora"), (4.6, 8035)),
]
QWEN_ROWS = [  # (row, options, the seed's H100 figures: peak GiB unknown, tokens/s)
    ("baseline", dict(lce=True), (None, 5200)),
    ("+compile", dict(lce=True, compile=True), (None, 7900)),
    ("+packing", dict(lce=True, compile=True, packed=True), (None, 57000)),
]
TABLES = {
    "llama": dict(title="Llama 3.2 3B (torchtune's published A100 table)", rows=LLAMA_ROWS,
                  batch=2, padded_batch=2, seq=256 if SMOKE else 4096, vocab=256 if SMOKE else 128_256),
    "qwen": dict(title="Qwen3-0.6B (the seed's H100 figures)", rows=QWEN_ROWS,
                 batch=4, padded_batch=8, seq=256 if SMOKE else 2048, vocab=256 if SMOKE else 151_936),
}
wanted = os.environ.get("ROWS")
wanted = None if not wanted else {tuple(x.split(":", 1)) for x in wanted.split(",")}
ROW_KEY = {"baseline": "baseline", "+packing": "packing", "+compile": "compile", "+linear CE": "linear_ce",
           "+AC": "ac", "+opt-in-bwd": "opt_in_bwd", "+offloading": "offload", "+AdamW8bit": "adamw8bit",
           "LoRA": "lora", "QLoRA": "qlora"}


def samples(vocab, seq, n=48 if SMOKE else 4096, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.distributions.LogNormal(3.5 if SMOKE else 5.5, 0.8).sample((n,)).clamp(16, seq).long()
    out = []
    for length in lengths.tolist():
        toks = torch.randint(0, vocab, (length,), generator=gen).tolist()
        labels = toks[1:] + [-100]
        labels[: length // 2] = [-100] * (length // 2)
        out.append({"tokens": toks, "labels": labels, "source_id": 0})
    return out


def batches(data, packed_data, packed, batch):
    src = packed_data if packed else data
    i = 0
    while True:
        rows = [src[(i + k) % len(src)] for k in range(batch)]
        i += batch
        b = packed_collate(rows) if packed else padded_collate(rows, pad_id=0)
        yield {k: v.to(DEV, non_blocking=True) for k, v in b.items()}


def build(table, o):
    if table == "llama":
        sizes = dict(llama3.SIZES["llama3_tiny" if SMOKE else "llama3_2_3b"])
        full, lora = llama3.llama3, llama3.lora_llama3
    else:
        sizes = dict(qwen3.SIZES["qwen3_tiny" if SMOKE else "qwen3_0_6b"])
        full, lora = qwen3.qwen3, qwen3.lora_qwen3
    sizes["max_seq_len"] = TABLES[table]["seq"]
    if SMOKE:
        sizes.update(embed_dim=128, num_kv_heads=4, head_dim=32, vocab_size=256)  # NF4 needs 16,384-value weights
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in bf16 directly (an NF4 base must not be cast)
    try:
        with torch.device(DEV):
            if o["method"] == "full":
                model = full(**sizes)
            else:
                model = lora(**sizes, lora_attn_modules=("q_proj", "v_proj", "output_proj"), apply_lora_to_mlp=True,
                             lora_rank=64, lora_alpha=128.0, quantize_base=o["method"] == "qlora")
    finally:
        torch.set_default_dtype(torch.float32)
    if o["method"] != "full":
        for n, p in model.named_parameters():
            p.requires_grad_("lora_" in n)
    if o["ac"]:
        apply_activation_checkpointing(model, every_k=1)
    if o["compile"]:
        for block in model.layers:
            block.compile(backend="eager" if SMOKE else "inductor")
    return model


def run_row(table, row, o, steps=2 if SMOKE else 8, warmup=1 if SMOKE else 3):
    t = TABLES[table]
    note = None
    if o["offload"] and DEV.type != "cuda":
        o, note = {**o, "offload": False}, "without offloading (needs CUDA)"
    data = samples(t["vocab"], t["seq"])
    packed_data = PackedDataset(data, max_seq_len=t["seq"]) if o["packed"] else None
    model = build(table, o)
    stream = batches(data, packed_data, o["packed"], t["batch"] if o["packed"] else t["padded_batch"])
    params = [p for p in model.parameters() if p.requires_grad]
    if o["oib"]:
        make = (lambda ps: adamw_8bit(ps, lr=1e-5)) if o["optim"] == "adamw8bit" else (
            lambda ps: torch.optim.AdamW(ps, lr=1e-5, fused=DEV.type == "cuda"))
        opt = setup_optimizer_in_backward(model, make)
    elif o["optim"] == "adamw8bit":
        opt = adamw_8bit(params, lr=1e-5)
    else:
        opt = torch.optim.AdamW(params, lr=1e-5, fused=DEV.type == "cuda")
    lce, ce = LinearCrossEntropyLoss(reduction="sum"), ChunkedCrossEntropyLoss(reduction="sum")
    offload = ActivationOffloading(model) if o["offload"] else contextlib.nullcontext()
    times, tokens = [], []
    reset_peak()
    for i in range(warmup + steps):
        b = next(stream)
        sync(); t0 = time.perf_counter()
        n = (b["labels"] != -100).sum().clamp(min=1)
        kw = {"position_ids": b["position_ids"], "document_ids": b.get("document_ids")}
        with offload:
            if o["lce"]:
                loss = lce(model.forward_hidden(b["tokens"], **kw), model.output_weight, b["labels"]) / n
            else:
                loss = ce(model(b["tokens"], **kw), b["labels"]) / n  # [B,S,V] logits in memory
        loss.backward()
        loss = loss.detach()
        opt.step(); opt.zero_grad(set_to_none=True)
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            tokens.append(int((b["source_ids"] >= 0).sum()))
    res = {"table": table, "row": row, "tokens_per_sec": sum(tokens) / sum(times),
           "step_s_median": statistics.median(times), "peak_gib": peak_gib(), "loss": loss.item(), "note": note}
    del model, opt
    reset_peak()
    return res


def fmt(x, spec):
    return "-" if x is None or x != x else format(x, spec)


t_start = time.time()
device = "cpu (SMOKE: figures meaningless)" if SMOKE else torch.cuda.get_device_name()
print(f"device: {device}, torch {torch.__version__}", flush=True)
results = []
for table, t in TABLES.items():
    print(f"\n{t['title']}: batch {t['batch']} packed / {t['padded_batch']} padded, seq {t['seq']}, bf16", flush=True)
    print(f"{'row':<14}{'tokens/s':>11}{'peak GiB':>10}   {'published tok/s':>16}{'published GiB':>15}", flush=True)
    for row, opts, (ref_gib, ref_tps) in t["rows"]:
        if wanted is not None and (table, ROW_KEY.get(row, row.lstrip("+"))) not in wanted:
            continue
        res = run_row(table, row, {**FULL, **opts})
        res.update(published_tokens_per_sec=ref_tps, published_peak_gib=ref_gib)
        results.append(res)
        print(f"{row:<14}{res['tokens_per_sec']:>11.0f}{fmt(res['peak_gib'], '.1f'):>10}   "
              f"{ref_tps:>16}{fmt(ref_gib, '.1f'):>15}" + (f"   {res['note']}" if res["note"] else ""), flush=True)
json.dump({"device": device, "date": time.strftime("%Y-%m-%d"), "smoke": SMOKE, "results": results},
          open("bench/out/gpu_sft.json", "w"), indent=2)
print(f"\ntotal {time.time() - t_start:.0f} s", flush=True)
PYEOF
if [[ -z "${ROWS:-}" || ",${ROWS}," == *",moe:step,"* ]]; then
  if [[ "${SMOKE:-}" == "1" ]]; then
    SMOKE=1 "$PY" bench/moe_step.py
  else
    DEVICE=cuda DTYPE=bf16 "$PY" bench/moe_step.py
  fi
fi
