"""SFT training throughput: tunebench vs HF transformers (plain PyTorch loop) vs torchtune 0.6.1.

    bash bench/torchtune_env.sh                 # once: torchtune 0.6.1 in bench/.venv-torchtune
    .venv/bin/python bench/sft_throughput.py    # ~5-8 minutes on a 2-core CPU

Every contender trains the same Llama-shaped model (the same random weights, saved once by
transformers and loaded by each), on the same token batches, with the same optimizer (AdamW, fused),
in fp32 and bf16, at two shapes: "tiny" (4 layers, dim 256) and "50m" (8 layers, dim 512, ~58M
parameters). One optimizer step = forward + loss + backward + AdamW step + zero_grad.

- tunebench: `engine.models.llama3` decoder + `LinearCrossEntropyLoss`, inside
  `engine.training.cpu_fast_paths` (as the SFT recipe runs it on CPU: freed buffers kept between steps,
  and on CPUs without bf16 instructions bf16 matmuls/attention computed in fp32 and rounded to bf16).
- transformers: `LlamaForCausalLM` (SDPA attention) + cross-entropy on its logits in fp32.
- torchtune: `torchtune.models.llama3.llama3` + `CEWithChunkedOutputLoss` (its recipes' default),
  weights converted with its own `hf_to_tune`.

Each (contender, shape, dtype) runs in a fresh process; the figure is the median tokens/s over the
timed steps after warm-up. MFU = tokens/s x model FLOPs per token (6N + attention, from
`engine.training.model_flops_per_token`) / this machine's fastest measured matmul rate for that dtype
(for bf16: the faster of bf16 and fp32 GEMM, since a CPU without bf16 instructions runs bf16 GEMM ~40x
slower than fp32).
Writes a Markdown table to stdout and JSON to bench/out/sft_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TORCHTUNE_PY = HERE / ".venv-torchtune" / "bin" / "python"

SHAPES = {
    # vocab, layers, heads, kv heads, dim, ffn; batch x seq tokens per step
    "tiny": dict(vocab=32000, layers=4, heads=8, kv_heads=4, dim=256, ffn=704, batch=4, seq=256),
    "50m": dict(vocab=32000, layers=8, heads=8, kv_heads=4, dim=512, ffn=1408, batch=2, seq=256),
}
DTYPES = ("fp32", "bf16")


# ------------------------------------------------------------------------------------- shared setup
def _torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def _batch(shape: dict):
    """Same tokens for everyone: `tokens [B,S]`, `labels [B,S]` already shifted (last = -100)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]), generator=gen)
    labels = torch.full_like(tokens, -100)
    labels[:, :-1] = tokens[:, 1:]
    return tokens, labels


def _save_hf_weights(shape: dict, folder: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=shape["vocab"], hidden_size=shape["dim"], intermediate_size=shape["ffn"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"], max_position_embeddings=shape["seq"], rope_theta=10000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(folder)


def _time_steps(step, *, warmup: int, steps: int) -> list[float]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


# ------------------------------------------------------------------------------------------ workers
def _worker_tunebench(shape: dict, dtype_name: str, hf_dir: Path, warmup: int, steps: int) -> list[float]:
    import torch

    from engine.checkpoint import load_hf_weights
    from engine.models.llama3 import llama3
    from engine.modules.loss import LinearCrossEntropyLoss
    from engine.training.cpu_fast_paths import cpu_fast_paths, keep_freed_memory_for_cpu_training

    dtype = _torch_dtype(dtype_name)
    with torch.device("meta"):
        model = llama3(
            vocab_size=shape["vocab"], num_layers=shape["layers"], num_heads=shape["heads"],
            num_kv_heads=shape["kv_heads"], embed_dim=shape["dim"], intermediate_dim=shape["ffn"],
            max_seq_len=shape["seq"], rope_base=10000.0, norm_eps=1e-5,
        )  # fmt: skip
    load_hf_weights(model, hf_dir, dtype=dtype)
    loss_fn = LinearCrossEntropyLoss(reduction="sum")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens, labels = _batch(shape)
    n = int((labels != -100).sum())

    def step():
        hidden = model.forward_hidden(tokens)  # [B,S,D]
        loss = loss_fn(hidden, model.output_weight, labels) / n
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # as the recipes run on CPU (engine.recipes._entry.run_recipe_main): freed buffers kept for the
    # next step; bf16 matmuls in fp32 on CPUs without bf16 instructions
    keep_freed_memory_for_cpu_training("cpu")
    with cpu_fast_paths("cpu", dtype):
        return _time_steps(step, warmup=warmup, steps=steps)


def _worker_hf(shape: dict, dtype_name: str, hf_dir: Path, warmup: int, steps: int) -> list[float]:
    import torch
    import torch.nn.functional as F
    import transformers

    dtype = _torch_dtype(dtype_name)
    model = transformers.LlamaForCausalLM.from_pretrained(hf_dir, dtype=dtype, attn_implementation="sdpa")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens, labels = _batch(shape)

    def step():
        logits = model(input_ids=tokens).logits  # [B,S,V]
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return _time_steps(step, warmup=warmup, steps=steps)


def _worker_torchtune(shape: dict, dtype_name: str, hf_dir: Path, warmup: int, steps: int) -> list[float]:
    import torch
    from safetensors.torch import load_file
    from torchtune.models import convert_weights
    from torchtune.models.llama3 import llama3
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    dtype = _torch_dtype(dtype_name)
    model = llama3(
        vocab_size=shape["vocab"], num_layers=shape["layers"], num_heads=shape["heads"],
        num_kv_heads=shape["kv_heads"], embed_dim=shape["dim"], max_seq_len=shape["seq"],
        intermediate_dim=shape["ffn"], norm_eps=1e-5, rope_base=10000.0,
    )  # fmt: skip
    hf_sd = load_file(str(hf_dir / "model.safetensors"))
    sd = convert_weights.hf_to_tune(
        hf_sd, num_heads=shape["heads"], num_kv_heads=shape["kv_heads"], dim=shape["dim"]
    )
    model.load_state_dict(sd)
    model.to(dtype)
    loss_fn = CEWithChunkedOutputLoss()
    model.set_num_output_chunks(loss_fn.num_output_chunks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens, labels = _batch(shape)

    def step():
        logits = model(tokens)  # list of [B, S/chunks, V]
        loss = loss_fn(logits, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return _time_steps(step, warmup=warmup, steps=steps)


WORKERS = {"tunebench": _worker_tunebench, "transformers": _worker_hf, "torchtune": _worker_torchtune}


def _run_worker(impl: str, shape_name: str, dtype: str, hf_dir: Path, warmup: int, steps: int) -> dict:
    python = str(TORCHTUNE_PY) if impl == "torchtune" else sys.executable
    cmd = [python, str(Path(__file__).resolve()), "--worker", impl, shape_name, dtype, str(hf_dir),
           "--warmup", str(warmup), "--steps", str(steps)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO) if impl != "torchtune" else "")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return {"error": tail[0]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- main
def _flops_per_token(shape: dict) -> float:
    import torch

    from engine.models.llama3 import llama3
    from engine.training import count_matmul_params, model_flops_per_token

    with torch.device("meta"):
        model = llama3(
            vocab_size=shape["vocab"], num_layers=shape["layers"], num_heads=shape["heads"],
            num_kv_heads=shape["kv_heads"], embed_dim=shape["dim"], intermediate_dim=shape["ffn"],
            max_seq_len=shape["seq"],
        )  # fmt: skip
    return model_flops_per_token(count_matmul_params(model), shape["layers"], shape["dim"], shape["seq"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=4, metavar=("IMPL", "SHAPE", "DTYPE", "HF_DIR"))
    parser.add_argument("--shapes", default="tiny,50m")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--impls", default="tunebench,transformers,torchtune")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--bf16-steps", type=int, default=3, help="timed steps in bf16 (one warm-up): peers take ~40 s a step"
    )
    parser.add_argument("--out", default=str(HERE / "out" / "sft_throughput.json"))
    args = parser.parse_args()

    if args.worker:
        impl, shape_name, dtype, hf_dir = args.worker
        shape = SHAPES[shape_name]
        times = WORKERS[impl](shape, dtype, Path(hf_dir), args.warmup, args.steps)
        tokens = shape["batch"] * shape["seq"]
        print(json.dumps({"step_s": times, "tokens_per_sec": tokens / statistics.median(times)}))
        return 0

    from engine.training import measure_matmul_flops

    impls = args.impls.split(",")
    if "torchtune" in impls and not TORCHTUNE_PY.exists():
        print(
            "torchtune venv missing: run `bash bench/torchtune_env.sh` first (or --impls without torchtune)"
        )
        return 2
    # MFU's denominator: this machine's fastest matmul rate. For bf16 that is the fp32 GEMM on CPUs
    # without bf16 instructions (native bf16 GEMM is ~40x slower there), so it is measured too.
    measured = {d: measure_matmul_flops(_torch_dtype(d)) for d in {*args.dtypes.split(","), "fp32"}}
    peaks = {d: max(measured[d], measured["fp32"]) for d in args.dtypes.split(",")}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape_name in args.shapes.split(","):
            shape = SHAPES[shape_name]
            hf_dir = Path(tmp) / shape_name
            _save_hf_weights(shape, hf_dir)
            fpt = _flops_per_token(shape)
            for dtype in args.dtypes.split(","):
                row = {"shape": shape_name, "dtype": dtype, "peak_tflops": peaks[dtype] / 1e12}
                for impl in impls:
                    warmup, steps = (1, args.bf16_steps) if dtype == "bf16" else (args.warmup, args.steps)
                    res = _run_worker(impl, shape_name, dtype, hf_dir, warmup, steps)
                    row[impl] = res
                    if "tokens_per_sec" in res:
                        res["mfu"] = res["tokens_per_sec"] * fpt / peaks[dtype]
                    print(
                        f"{shape_name} {dtype} {impl}: {res.get('tokens_per_sec', res.get('error'))}",
                        flush=True,
                    )
                results.append(row)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")

    print(
        "\n| shape | dtype | tunebench tok/s | transformers tok/s | torchtune tok/s | vs faster peer | MFU ours / tt / hf |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in results:
        tps = {i: row[i].get("tokens_per_sec") for i in impls if i in row}
        peers = [v for k, v in tps.items() if k != "tunebench" and v]
        ratio = f"{tps['tunebench'] / max(peers):.2f}x" if tps.get("tunebench") and peers else "n/a"
        mfus = " / ".join(f"{row[i]['mfu'] * 100:.0f}%" if "mfu" in row.get(i, {}) else "n/a"
                          for i in ("tunebench", "torchtune", "transformers"))  # fmt: skip
        cells = " | ".join(f"{tps[i]:,.0f}" if tps.get(i) else str(row.get(i, {}).get("error", "n/a"))[:40]
                           for i in ("tunebench", "transformers", "torchtune"))  # fmt: skip
        print(f"| {row['shape']} | {row['dtype']} | {cells} | {ratio} | {mfus} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
