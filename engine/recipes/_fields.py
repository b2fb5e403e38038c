"""The config keys several recipes share, each declared once (type, default, bounds, doc, controls).

A recipe's `CONFIG_SCHEMA` takes them with `shared(key)` (or `shared(key, "its own doc line")`) and
declares its own keys in place; see `engine.config.recipe_schema` for what reads a schema.
"""

from __future__ import annotations

from engine.config._errors import ConfigProblem
from engine.config.recipe_schema import REQUIRED, Field

DTYPE_NAMES = ("fp32", "float32", "bf16", "bfloat16")

_COMPONENT = dict(component=True)

SHARED: dict[str, Field] = {
    "output_dir": Field(
        str | None,
        None,
        "run folder: checkpoints go to output_dir/checkpoints/step_<N>/ (the launcher sets runs/<id>)",
    ),
    "seed": Field(int, 0, "seed for weights of new parameters, data order and dropout (same on every rank)"),
    "device": Field(
        str | None,
        None,
        "cpu, cuda or auto (cuda when present)",
        pattern=r"cpu|auto|cuda(:\d+)?",
        expect="cpu, cuda, cuda:N or auto",
    ),  # fmt: skip
    "dtype": Field(
        str,
        "fp32",
        "fp32 or bf16 for weights and compute (bf16 halves memory; fp32 is exact on CPU)",
        pattern="|".join(DTYPE_NAMES),
        expect="fp32 or bf16",
    ),  # fmt: skip
    "checkpoint_dir": Field(
        str | None,
        None,
        "Hugging Face model folder to start from, 'demo' for the embedded SmolLM2, null for random init",
    ),
    "model": Field(
        dict,
        REQUIRED,
        "_component_ model builder (engine.models...); lora_*/qlora_* builders train adapters only",
        controls=("lora_rank",),
        **_COMPONENT,
    ),  # fmt: skip
    "tokenizer": Field(
        dict,
        REQUIRED,
        "_component_ tokenizer (engine.data.tokenizers.load_tokenizer with path)",
        **_COMPONENT,
    ),
    "dataset": Field(
        dict | list,
        REQUIRED,
        "_component_ dataset, or a list of them (a mix; loss per source is logged)",
        controls=("packing",),
        **_COMPONENT,
    ),  # fmt: skip
    "batch_size": Field(int, 1, "samples per micro-batch on each rank", minimum=1),
    "gradient_accumulation_steps": Field(
        int, 1, "micro-batches per optimizer step (memory for batch size; same result)", minimum=1
    ),
    "epochs": Field(int, 1, "passes over the training split", minimum=1),
    "max_steps_per_epoch": Field(
        int | None, None, "cap on optimizer steps per epoch (null: the whole epoch)", minimum=1
    ),
    "optimizer": Field(
        dict,
        REQUIRED,
        "_component_ optimizer (torch.optim.AdamW, torchao.optim.AdamW8bit, ...); params passed in",
        controls=("optimizer",),
        **_COMPONENT,
    ),  # fmt: skip
    "lr_scheduler": Field(
        dict | None,
        None,
        "_component_ schedule (engine.training.lr_schedules...); num_training_steps is filled in",
        **_COMPONENT,
    ),  # fmt: skip
    "clip_grad_norm": Field(float | None, None, "max global gradient norm (null: no clipping)", above=0.0),
    "loss": Field(dict | None, None, "_component_ loss", **_COMPONENT),
    "enable_activation_checkpointing": Field(
        bool,
        False,
        "recompute block activations in backward (less memory, ~30% slower)",
        controls=("activation_checkpointing",),
    ),  # fmt: skip
    "compile": Field(
        bool, False, "torch.compile each block (faster steps after a one-off compile)", controls=("compile",)
    ),
    "fsdp": Field(
        dict | None,
        {},
        "{reshard_after_forward, cpu_offload} for multi-rank runs (FSDP2); absent or null: the defaults",
        keys={
            "reshard_after_forward": Field(bool, True, "free gathered weights after each block's forward"),
            "cpu_offload": Field(bool, False, "keep sharded parameters and optimizer state in host memory"),
        },
    ),  # fmt: skip
    "save_every_n_steps": Field(
        int | None, None, "checkpoint period in optimizer steps (null: epoch ends only)", minimum=1
    ),
    "keep_last_n_checkpoints": Field(int, 2, "complete checkpoints to keep", minimum=1),
    "resume": Field(
        bool | str | None,
        False,
        "true: continue from the latest checkpoint in output_dir; a path: from that checkpoint",
    ),
    "shuffle": Field(bool, True, "shuffle the training split each epoch (seeded)"),
    "neftune_alpha": Field(
        float,
        0.0,
        "NEFTune: uniform noise of alpha/sqrt(seq_len*dim) on input embeddings while training (0: off; "
        "the paper's 5 is a common choice)",
        minimum=0.0,
    ),  # fmt: skip
}


def neftune_problems(cfg: dict) -> list[ConfigProblem]:
    """`neftune_alpha` with tensor or context parallelism: those ranks hold the same (or one slice of
    the) activations and would each draw other noise, so NEFTune runs under data parallelism / FSDP2."""
    alpha = cfg.get("neftune_alpha") or 0
    split = {k: cfg.get(k) for k in ("tensor_parallel_dim", "context_parallel_dim")}
    split = {k: v for k, v in split.items() if isinstance(v, int) and not isinstance(v, bool) and v > 1}
    if not isinstance(alpha, (int, float)) or alpha <= 0 or not split:
        return []
    key, degree = next(iter(split.items()))
    return [
        ConfigProblem(
            "neftune_alpha",
            f"NEFTune draws noise per rank, which {key}={degree} ranks must share",
            f"set neftune_alpha: 0 or {key}: 1",
        )
    ]


def shared(key: str, doc: str | None = None, **changes) -> Field:
    """The shared declaration of `key`, with this recipe's own doc line (and other changes) if given."""
    f = SHARED[key]
    return f.but(doc=doc, **changes) if doc is not None else (f.but(**changes) if changes else f)


def shared_fields(*keys: str) -> dict[str, Field]:
    """`{key: shared(key)}` for several keys, in order."""
    return {k: SHARED[k] for k in keys}


_POSITIVE = Field(int, 1, "", minimum=1)


def validation_field(*, what: str, share_of: str, fraction: float, every_n_steps_doc: str) -> Field:
    """The `validation:` block (read by `engine.training.holdout.validation_split`): a share of the
    training data held out (`fraction`, its default), or a dataset of its own, scored every N optimizer
    steps; null for none. `what` / `share_of` name the held-out rows in the docs ("pairs")."""
    return Field(
        dict | None,
        None,
        f"held-out {what}: {{fraction | dataset, every_n_steps, max_batches}}; null for none",
        keys={
            "fraction": Field(float, fraction, f"share of {share_of} held out", above=0.0, below=1.0),
            "dataset": Field(
                dict | list | None, None, "_component_ held-out dataset instead", component=True
            ),
            "every_n_steps": _POSITIVE.but(default=50, doc=every_n_steps_doc),
            "max_batches": Field(int | None, None, "first N batches only (null: all)", minimum=1),
        },
    )


# The keys the rollout recipes (ppo; grpo and grpo_async through engine.rl.grpo_trainer) read alike:
# a step samples completions for a batch of prompts, scores them and trains on them.
ROLLOUT: dict[str, Field] = {
    "output_dir": shared("output_dir", "run folder (checkpoints, samples.jsonl)"),
    "seed": shared("seed", "seed for new parameters, prompt order and sampling"),
    "checkpoint_dir": shared(
        "checkpoint_dir", "Hugging Face model folder of the starting policy, 'demo', or null (random init)"
    ),
    "model": shared(
        "model", "_component_ policy builder; lora_* trains adapters (reference = adapters disabled)"
    ),
    "batch_size": shared("batch_size", "prompts per step"),
    "max_new_tokens": _POSITIVE.but(default=128, doc="completion length cap"),
    "temperature": Field(
        float, 1.0, "sampling temperature of the rollouts (and of the log-probs of the ratio)", above=0.0
    ),
    "top_k": Field(int | None, None, "sample from the k most likely tokens (null: all)", minimum=1),
    "top_p": Field(float | None, None, "nucleus sampling mass (null: off)", above=0.0, maximum=1.0),
    "stop_tokens": Field(
        list[int] | None,
        None,
        "extra token ids that end a completion (the tokenizer's stop tokens always do)",
    ),
    "rewards": Field(
        dict | None,
        None,
        "{name: _component_ reward fn} called with completions=, answers=, prompts= (engine.rl.rewards)",
        values=Field(dict, None, "a reward function", component=True),
    ),  # fmt: skip
    "reward_weights": Field(
        dict[str, float] | None,
        None,
        "{name: weight} for the total reward (default 1 each)",
        expect="a mapping of reward name to number, or null",
    ),  # fmt: skip
    "epochs": shared("epochs", "passes over the prompts"),
    "max_steps_per_epoch": shared(
        "max_steps_per_epoch", "cap on rollout steps per epoch (null: whole epoch)"
    ),
    "lr_scheduler": shared(
        "lr_scheduler", "_component_ schedule (num_training_steps is filled in with optimizer steps), or null"
    ),
    "num_samples_to_log": Field(
        int, 4, "completions per step written to output_dir/samples.jsonl", minimum=0
    ),
    "enable_activation_checkpointing": shared(
        "enable_activation_checkpointing", "recompute blocks in backward"
    ),
    "save_every_n_steps": shared("save_every_n_steps", "checkpoint period in steps (null: epoch ends only)"),
}


def rollout_fields(*keys: str) -> dict[str, Field]:
    """`{key: ROLLOUT[key]}` for several keys, in order (the rollout recipes' shared declarations)."""
    return {k: ROLLOUT[k] for k in keys}


def rollout(key: str, doc: str) -> Field:
    """The rollout recipes' declaration of `key` with this recipe's own doc line."""
    return ROLLOUT[key].but(doc=doc)
