"""Training-step throughput (forward + backward, tokens/s) of the native decoder vs transformers.

    .venv/bin/python bench/models_forward_backward.py [--layers 2] [--batch 2] [--seq 256] [--steps 8]

Same shape, same weights (a random SmolLM2-shaped Llama saved by transformers and loaded with
`engine.models.from_pretrained`), fp32 on CPU, full-vocabulary cross-entropy on both sides.
Steps alternate between the two models so background load hits both alike; reports medians
and the ratio ours / transformers (goal >= 1.0).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def _step(forward, tokens, labels) -> tuple[float, float, torch.Tensor]:
    start, cpu_start = time.perf_counter(), time.process_time()
    logits = forward(tokens)  # [B,S,V]
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    loss.backward()
    return time.perf_counter() - start, time.process_time() - cpu_start, loss.detach()


def main() -> None:
    import transformers

    from engine.models import from_pretrained

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=args.layers,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, tie_word_embeddings=True,
    )  # fmt: skip
    theirs = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()
    with tempfile.TemporaryDirectory() as tmp:
        theirs.save_pretrained(Path(tmp))
        ours = from_pretrained(tmp).train()

    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq))
    labels = torch.randint(0, config.vocab_size, (args.batch, args.seq))
    runners = {"tunebench": lambda t: ours(t), "transformers": lambda t: theirs(t).logits}
    models = {"tunebench": ours, "transformers": theirs}
    times: dict[str, list[float]] = {name: [] for name in runners}
    cpu: dict[str, list[float]] = {name: [] for name in runners}
    losses = {}
    for step in range(args.steps + 1):  # step 0 warms up
        order = list(runners) if step % 2 else list(reversed(runners))
        for name in order:
            models[name].zero_grad(set_to_none=True)
            seconds, cpu_seconds, loss = _step(runners[name], tokens, labels)
            losses[name] = loss
            if step:
                times[name].append(seconds)
                cpu[name].append(cpu_seconds)
    torch.testing.assert_close(losses["tunebench"], losses["transformers"], atol=1e-4, rtol=1e-5)

    n_tokens = args.batch * args.seq
    rate = {name: n_tokens / statistics.median(t) for name, t in times.items()}
    print(
        f"shape: {args.layers} layers, dim 576, GQA 9/3, vocab 49152, batch {args.batch} x seq {args.seq}, fp32, "
        f"torch {torch.__version__}, transformers {transformers.__version__}, {platform.processor() or 'cpu'}, "
        f"threads {torch.get_num_threads()}"
    )
    cpu_rate = {name: n_tokens / statistics.median(t) for name, t in cpu.items()}
    for name in runners:
        print(
            f"{name:13s} median {statistics.median(times[name]) * 1e3:8.1f} ms/step  {rate[name]:8.1f} tokens/s  "
            f"(process CPU time: {statistics.median(cpu[name]) * 1e3:8.1f} ms/step, {cpu_rate[name]:8.1f} tokens/CPU-s)"
        )
    print(f"ratio tunebench / transformers (wall): {rate['tunebench'] / rate['transformers']:.2f}x")
    print(
        f"ratio tunebench / transformers (CPU time): {cpu_rate['tunebench'] / cpu_rate['transformers']:.2f}x"
    )


if __name__ == "__main__":
    main()
