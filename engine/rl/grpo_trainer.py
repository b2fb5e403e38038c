"""The GRPO trainer core: config keys, rollouts -> advantages -> clipped-ratio steps, logging and
checkpoints. The synchronous recipe (engine.recipes.grpo) and the asynchronous one (grpo_async, with
Ray generators) each run their own training loop over it; see engine/recipes/grpo.py for the method."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from engine.checkpoint.recipe_state import resume_training, save_training_checkpoint
from engine.config import ConfigProblem, instantiate
from engine.config.recipe_schema import Field, Schema
from engine.recipes._fields import rollout_fields, shared, shared_fields
from engine.rl.rollout import (
    Rollout,
    generate_and_score,
    prompt_loader,
    rollout_attention_mask,
    rollout_batch,
)
from engine.training import recipe_loop
from engine.training.model_setup import build_model, build_tokenizer, check_vocab
from engine.training.optimizer_setup import build_optimizer
from engine.training.router_aux import RouterAuxLoss

_NO_BWD = "reads no optimizer_in_bwd (only sft steps the optimizer in backward)"
_POSITIVE = Field(int, 1, "", minimum=1)


def _rollout_problems(cfg: dict) -> list[ConfigProblem]:
    """Rewards to score with, weights naming them, and minibatches that split the step's rollouts."""
    out = []
    rewards = cfg["rewards"] or {}
    if not rewards:
        out.append(
            ConfigProblem(
                "rewards", "missing", "add e.g. {math: {_component_: engine.rl.rewards.math_reward}}"
            )
        )
    unknown = sorted(set(cfg["reward_weights"] or {}) - set(rewards))
    if rewards and unknown:
        out.append(
            ConfigProblem(
                "reward_weights", f"{unknown[0]!r} is not a reward name", f"use one of {sorted(rewards)}"
            )
        )
    rows = cfg["batch_size"] * cfg["group_size"]
    mini = cfg["minibatch_size"] or rows
    if rows % mini:
        out.append(
            ConfigProblem(
                "minibatch_size",
                f"{mini} does not divide batch_size * group_size = {rows}",
                f"use a divisor of {rows}, or null for all {rows} in one step",
            )
        )
    return out


# Every key this recipe reads: validation, `tunebench validate`, the launcher and the Recipe screen read it.
GRPO_SCHEMA = Schema(
    {
        **rollout_fields("output_dir", "seed"),
        **shared_fields("device", "dtype"),
        **rollout_fields("checkpoint_dir", "model"),
        "tokenizer": shared("tokenizer", "_component_ tokenizer ('demo' path for the embedded model's)"),
        "dataset": shared(
            "dataset",
            "_component_ prompt dataset (prompt_dataset, demo_prompt_dataset, ...): prompts + answers",
            controls=(),
        ),  # fmt: skip
        **rollout_fields("batch_size"),
        "group_size": _POSITIVE.but(
            default=8, doc="completions sampled per prompt (G); advantages are normalised within each group"
        ),
        **rollout_fields("max_new_tokens", "temperature", "top_k", "top_p", "stop_tokens"),
        **rollout_fields("rewards", "reward_weights"),
        "scale_rewards": Field(
            bool,
            True,
            "divide advantages by the group's std (true, GRPO) or only centre them (false, Dr. GRPO)",
        ),
        "ppo_epochs": _POSITIVE.but(
            doc="optimisation passes over each batch of rollouts (>1 reuses samples; the ratio is clipped)"
        ),
        "minibatch_size": Field(
            int | None,
            None,
            "completions per optimizer step (null: all of the step's batch_size * group_size)",
            minimum=1,
        ),  # fmt: skip
        **rollout_fields("epochs", "max_steps_per_epoch"),
        **shared_fields("optimizer"),
        **rollout_fields("lr_scheduler"),
        **shared_fields("clip_grad_norm"),
        "loss": shared(
            "loss", "_component_ engine.modules.loss.GRPOLoss {epsilon, epsilon_high, kl_coeff, aggregation}"
        ),
        **rollout_fields("num_samples_to_log", "enable_activation_checkpointing"),
        **shared_fields("compile"),
        **rollout_fields("save_every_n_steps"),
        **shared_fields("keep_last_n_checkpoints", "resume"),
    },
    checks=(_rollout_problems,),
    max_nproc=1,
    nproc_note="synchronous GRPO runs on one process (grpo_async spreads the rollouts)",
    absent={
        "optimizer_in_bwd": _NO_BWD,
        "linear_ce": "GRPOLoss works on per-token log-probs, not cross-entropy",
        "packing": "prompts are sampled into rollouts, not packed",
    },
    call_site_args=frozenset({"completions", "answers", "prompts"}),
)


class GRPOTrainer:
    """The GRPO trainer both GRPO recipes drive: `setup()`, `rollout()`, `step_on()`, `save_checkpoint()`,
    `cleanup()`; each recipe (engine.recipes.grpo, grpo_async) has its own `train()` loop.

    Args:
        cfg (dict): resolved config. Raises ConfigError for values that cannot work (named).
    """

    schema = GRPO_SCHEMA  # a recipe with more keys names its own

    def __init__(self, cfg: dict, *, dist_info=None) -> None:
        cfg = recipe_loop.start_recipe(self, self.schema, cfg, name="grpo", dist_info=dist_info)
        self.group_size = cfg["group_size"]
        self.max_new_tokens = cfg["max_new_tokens"]
        self.temperature = float(cfg["temperature"])
        self.ppo_epochs = cfg["ppo_epochs"]
        self.minibatch_size = cfg["minibatch_size"] or self.batch_size * self.group_size
        self.reward_nodes = dict(cfg["rewards"])
        self.reward_weights = dict(cfg["reward_weights"] or {})
        self.optimizer_steps = 0
        self.history: list[dict[str, float]] = []

    # ------------------------------------------------------------------------------------ set-up
    def setup(self) -> None:
        recipe_loop.start_setup(self)
        cfg = self.cfg
        common = {
            "dtype": self.dtype,
            "seed": self.seed,
            "device": self.device,
            "compile": bool(cfg["compile"]),
        }
        self.model, self.is_lora, self.model_dir = build_model(
            cfg["model"], cfg["checkpoint_dir"], trainable=True,
            activation_checkpointing=bool(cfg["enable_activation_checkpointing"]), **common,
        )  # fmt: skip
        node = cfg["loss"] or {"_component_": "engine.modules.loss.GRPOLoss"}
        self.loss_fn = instantiate(node)
        self.reference = None
        if not self.is_lora and self.loss_fn.kl_coeff > 0:
            self.reference, _, _ = build_model(cfg["model"], cfg["checkpoint_dir"], trainable=False, **common)
        self.tokenizer = build_tokenizer(cfg["tokenizer"])
        check_vocab(self.model, self.tokenizer)
        self.stop_tokens = sorted(
            set(self.tokenizer.stop_tokens) | {int(t) for t in cfg["stop_tokens"] or []}
        )
        self._setup_data()
        # The schedule counts optimizer steps: ppo_epochs passes over each step's minibatches.
        opt_steps = (
            self.total_steps * self.ppo_epochs * (self.batch_size * self.group_size // self.minibatch_size)
        )
        self.optimizer, self.lr_scheduler = build_optimizer(
            self.model, cfg["optimizer"], cfg["lr_scheduler"], num_training_steps=opt_steps
        )
        self.router_aux = RouterAuxLoss(self.model)  # MoE policy: load balancing joins the loss
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed + 1)
        state = resume_training(self, "optimizer_steps")
        if state is not None and state.get("generator") is not None:
            self.generator.set_state(state["generator"])
        self.stop.install()

    def _setup_data(self) -> None:
        self.loader = prompt_loader(
            self.cfg["dataset"], self.tokenizer, batch_size=self.batch_size, seed=self.seed, recipe="GRPO"
        )
        self.sampler = self.loader.batch_sampler
        per_epoch, most = len(self.sampler), self.cfg["max_steps_per_epoch"]
        per_epoch = per_epoch if most is None else min(per_epoch, int(most))
        self.steps_per_epoch = per_epoch
        self.total_steps = per_epoch * self.epochs

    # ------------------------------------------------------------------------------------ one step
    def rollout(self, prompts: list[list[int]], answers: list[str]) -> Rollout:
        """Sample G completions per prompt with the current policy and score them."""
        return generate_and_score(
            self.model, self.tokenizer, prompts, answers, group_size=self.group_size,
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, stop_tokens=self.stop_tokens,
            generator=self.generator, reward_nodes=self.reward_nodes, reward_weights=self.reward_weights,
            top_k=self.cfg["top_k"], top_p=self.cfg["top_p"], version=self.global_step,
        )  # fmt: skip

    def train_on(self, ro: Rollout) -> dict[str, float]:
        """Advantages, old/reference log-probs, then `ppo_epochs` x minibatch optimizer steps."""
        from engine.modules.loss import group_advantages
        from engine.training.logprobs import token_logprobs
        from engine.training.model_setup import reference_context

        adv = group_advantages(ro.rewards, self.group_size, scale_by_std=bool(self.cfg["scale_rewards"]))
        tokens, labels, mask = rollout_batch(ro.prompts, ro.completions, self.tokenizer.pad_id)
        real = rollout_attention_mask(ro.prompts, ro.completions, tokens.shape[1])  # [R,L]: not padding
        tokens, labels, mask, adv, real = (t.to(self.device) for t in (tokens, labels, mask, adv, real))
        lp = {"temperature": self.temperature}
        with torch.no_grad():
            old = token_logprobs(self.model, tokens, labels, **lp)  # [R,L]
            ref = None
            if self.loss_fn.kl_coeff > 0:
                ref_model, ctx = reference_context(self.model, self.reference)
                with ctx:
                    ref = token_logprobs(ref_model, tokens, labels, **lp)
        sums = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "ratio": 0.0, "grad_norm": 0.0}
        n = 0
        R = tokens.shape[0]
        perm_gen = torch.Generator().manual_seed(self.seed + 7 * self.global_step)
        for _ in range(self.ppo_epochs):
            order = torch.randperm(R, generator=perm_gen) if self.minibatch_size < R else torch.arange(R)
            for s in range(0, R, self.minibatch_size):
                idx = order[s : s + self.minibatch_size].to(self.device)
                logps = token_logprobs(self.model, tokens[idx], labels[idx], **lp)
                aux = self.router_aux.term(real[idx])  # MoE: over the prompt and completion tokens
                loss, stats = self.loss_fn(
                    logps, old[idx], adv[idx], mask[idx], None if ref is None else ref[idx]
                )
                recipe_loop.check_finite_loss(loss.item(), self.global_step + 1)
                (loss + aux).backward()
                _, gn = recipe_loop.optimizer_step(
                    self.model.parameters(), self.optimizer, self.lr_scheduler, self.clip_grad_norm
                )
                self.optimizer_steps += 1
                sums["loss"] += loss.item()
                sums["grad_norm"] += gn
                for k in ("kl", "clip_fraction", "ratio"):
                    sums[k] += float(stats[k])
                n += 1
        return {**{k: v / n for k, v in sums.items()}, **self.router_aux.metrics()}

    def _log_samples(self, ro: Rollout) -> None:
        k = int(self.cfg["num_samples_to_log"])
        if k <= 0:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            json.dumps(
                {
                    "step": self.global_step,
                    "prompt": ro.prompt_texts[i],
                    "completion": ro.texts[i],
                    "answer": ro.answers[i],
                    "reward": float(ro.rewards[i]),
                }
            )  # fmt: skip
            for i in range(min(k, len(ro.texts)))
        ]
        with open(self.output_dir / "samples.jsonl", "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")  # whole lines in one write

    def step_on(self, ro: Rollout, t0: float, extra: dict | None = None) -> dict[str, float]:
        """Train on one rollout, advance `global_step`, log the step's metrics and samples."""
        train_stats = self.train_on(ro)
        self.global_step += 1
        lengths = torch.tensor([len(c) for c in ro.completions], dtype=torch.float32)
        step_time = time.perf_counter() - t0
        tokens = sum(len(p) for p in ro.prompts) + float(lengths.sum())  # every sequence the step scored
        metrics = {
            "reward/mean": float(ro.rewards.mean()),
            "reward/std": float(ro.rewards.std()) if len(ro.rewards) > 1 else 0.0,
            **{f"rewards/{k}": float(v.mean()) for k, v in ro.per_reward.items()},
            **train_stats,
            "completion_length": float(lengths.mean()),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "rollout_tokens_per_sec": float(lengths.sum()) / max(ro.gen_time, 1e-9),
            "tokens_per_sec": tokens / max(step_time, 1e-9),
            "step_time": step_time,
            "epoch": self.epoch,
            **(extra or {}),
        }
        recipe_loop.log_step(self, metrics)
        self.history.append(metrics)
        self._log_samples(ro)
        return metrics

    # --------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        """`output_dir/checkpoints/step_<N>/`: policy (adapters or HF folder), optimizer, recipe state."""
        return save_training_checkpoint(
            self, "optimizer_steps", extra={"generator": self.generator.get_state()}
        )

    def cleanup(self) -> None:
        recipe_loop.close_logger(self.logger)
