"""Asynchronous vs synchronous GRPO throughput on one machine (CPU), one run each.

    .venv/bin/python bench/grpo_async.py [--steps 12] [--generators 2] [--staleness 2]

Workload: the digit-successor prompts (engine.rl.toy_task) with a randomly initialised 4-layer,
128-dim Llama over the 16-symbol tokenizer, 4 prompts x G=8 completions of up to 24 tokens per step,
one optimisation pass per batch (so generation is most of a synchronous step, as with real models).
Both runs use one torch thread in the trainer and in every generator. Reported: rollout tokens/s
(completion tokens generated per wall second of the training loop) and trainer steps/s; Ray start-up
and actor construction happen in `setup()` and are excluded (printed separately).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = {
    "_component_": "engine.models.llama3.llama3", "vocab_size": 16, "num_layers": 4, "num_heads": 4,
    "num_kv_heads": 2, "embed_dim": 128, "intermediate_dim": 256, "max_seq_len": 64,
}  # fmt: skip


def config(out: Path, steps: int, **extra) -> dict:
    return {
        "output_dir": str(out), "seed": 0, "device": "cpu", "dtype": "fp32", "checkpoint_dir": None,
        "model": dict(MODEL), "tokenizer": {"_component_": "engine.rl.toy_task.DigitTokenizer"},
        "dataset": {"_component_": "engine.rl.toy_task.digit_successor_dataset", "n": 400},
        "batch_size": 4, "group_size": 8, "max_new_tokens": 24, "temperature": 1.0,
        "rewards": {"correct": {"_component_": "engine.rl.toy_task.digit_successor_reward"}},
        "ppo_epochs": 1, "epochs": 1, "max_steps_per_epoch": steps,
        "optimizer": {"_component_": "torch.optim.AdamW", "lr": 1e-3},
        "loss": {"_component_": "engine.modules.loss.GRPOLoss", "kl_coeff": 0.04},
        "num_samples_to_log": 0, "save_every_n_steps": None, "keep_last_n_checkpoints": 1, **extra,
    }  # fmt: skip


def measure(recipe_cls, cfg: dict) -> dict:
    previous = signal.getsignal(signal.SIGTERM)
    recipe = recipe_cls(cfg)
    t0 = time.perf_counter()
    recipe.setup()
    setup_s = time.perf_counter() - t0
    try:
        t1 = time.perf_counter()
        recipe.train()
        wall = time.perf_counter() - t1
    finally:
        recipe.cleanup()
        signal.signal(signal.SIGTERM, previous)
    steps = len(recipe.history)
    tokens = sum(h["completion_length"] * 32 for h in recipe.history)
    return {"setup_s": setup_s, "wall_s": wall, "steps": steps, "tokens": tokens,
            "tokens_per_s": tokens / wall, "steps_per_s": steps / wall,
            "reward_last": sum(h["reward/mean"] for h in recipe.history[-3:]) / 3}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--generators", type=int, default=2)
    parser.add_argument("--staleness", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from engine.recipes.grpo import GRPORecipe
    from engine.recipes.grpo_async import AsyncGRPORecipe

    with tempfile.TemporaryDirectory() as tmp:
        sync = measure(GRPORecipe, config(Path(tmp) / "sync", args.steps))
        asyn = measure(AsyncGRPORecipe, config(Path(tmp) / "async", args.steps, num_generators=args.generators,
                                               max_staleness=args.staleness, weight_sync_every=1))  # fmt: skip
    for name, r in (("sync", sync), (f"async ({args.generators} gen, staleness {args.staleness})", asyn)):
        print(f"{name:32s} steps {r['steps']:3d}  wall {r['wall_s']:6.1f} s  rollout tokens/s {r['tokens_per_s']:7.1f}  "
              f"trainer steps/s {r['steps_per_s']:.3f}  setup {r['setup_s']:.1f} s")  # fmt: skip
    print(
        f"ratio async/sync: rollout tokens/s {asyn['tokens_per_s'] / sync['tokens_per_s']:.2f}x, "
        f"trainer steps/s {asyn['steps_per_s'] / sync['steps_per_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
