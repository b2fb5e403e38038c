"""PPO with a reward model (or verifiable rewards), a value model, and a KL penalty to the reference.

    python -m engine.recipes.ppo --config configs/demo/digit_successor_ppo.yaml
    python -m engine.recipes.ppo --config configs/demo/smollm2_135m_lora_ppo.yaml

One step: `batch_size` prompts x `num_samples` completions sampled with the policy
(engine.generation, KV cache) -> sequence scores from the frozen reward model at each sequence's last
non-pad token (`reward_model` + `reward_checkpoint_dir`) or from verifiable reward functions (`rewards`, as
GRPO's), minus `missing_eos_penalty` for completions cut at `max_new_tokens` -> per-token rewards
`-kl_coeff * (logp - ref_logp)` with the score on the last token -> values from the value model ->
GAE (`gamma`, `lam`) -> optional whitening -> `ppo_epochs` passes in minibatches of
`minibatch_size` completions, one optimizer step each, on `PPOLoss` (clipped policy + clipped value).

Models: the policy (`model`; `lora_*` trains adapters and the reference is the policy with its
adapters disabled, no copy; a full policy gets a frozen copy), the value model (`value_model`, a
`engine.models.reward.reward_model` node, from `value_checkpoint_dir`: the reward model's folder, or
the policy's with a fresh head) and the frozen reward model. The KL coefficient is fixed
(`kl_target: null`) or adapted towards `kl_target` nats per sequence (Ziegler et al., 2019).

Logged per step: `reward` (mean score), `reward/std`, `rewards/<name>`, `kl` (mean per-sequence
KL to the reference), `kl_coeff`, `policy_loss`, `value_loss`, `clip_fraction`, `value_clip_fraction`,
`approx_kl`, `entropy`, `response_length`, `missing_eos`, `loss`, `lr`, `grad_norm`,
`loss/aux` / `loss/aux_value` (an MoE policy's / value model's load-balancing loss, added to the
objective with its `router_aux_loss_coef`, padding left out),
`rollout_tokens_per_sec`, `step_time`; the first `num_samples_to_log` completions go to
`output_dir/samples.jsonl` and the first one also as a `sample` event. One process. Exit codes as in SFT.

Length: over 500 lines because one PPO step needs four models (policy, reference, value, reward) set
up here and the rollout -> GAE -> minibatch-epoch loop in one readable place; the math is in engine.rl.ppo_advantages.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import nn

from engine.checkpoint.recipe_state import resume_training, save_training_checkpoint
from engine.config import ConfigError, ConfigProblem, instantiate
from engine.config.recipe_schema import REQUIRED, Field, Schema
from engine.recipes._entry import recipe_entry
from engine.recipes._fields import rollout, rollout_fields, shared, shared_fields
from engine.rl.rollout import prompt_loader
from engine.training import recipe_loop
from engine.training.model_setup import build_model, build_tokenizer, check_vocab
from engine.training.optimizer_setup import build_optimizer
from engine.training.router_aux import RouterAuxLoss

_NO_BWD = "reads no optimizer_in_bwd (only sft steps the optimizer in backward)"
_POSITIVE = Field(int, 1, "", minimum=1)
_SCORER = "_component_ engine.models.reward.reward_model {decoder: {_component_: <family builder or lora_*>}}"


def _reward_problems(cfg: dict) -> list[ConfigProblem]:
    """A reward to train on, a reward model with its folder, and minibatches that split the rollouts."""
    out = []
    if not cfg["rewards"] and cfg["reward_model"] is None:
        out.append(ConfigProblem(
            "reward_model", "PPO needs a reward",
            "set reward_model + reward_checkpoint_dir (a trained reward model), or rewards: "
            "{name: {_component_: engine.rl.rewards.math_reward}}",
        ))  # fmt: skip
    if cfg["reward_model"] is not None and not cfg["reward_checkpoint_dir"]:
        out.append(ConfigProblem(
            "reward_checkpoint_dir", "missing",
            "point it at a trained reward model (a reward_model run's checkpoints/step_<N>/model/ or a "
            "*ForSequenceClassification folder)",
        ))  # fmt: skip
    unknown = set(cfg["reward_weights"] or {}) - set(cfg["rewards"] or {})
    if unknown:
        out.append(ConfigProblem("reward_weights", f"{sorted(unknown)[0]!r} is not a reward name",
                                 f"use one of {sorted(cfg['rewards'] or {})}"))  # fmt: skip
    rows = cfg["batch_size"] * cfg["num_samples"]
    horizon = cfg["kl_horizon"]
    if cfg["kl_target"] is not None and isinstance(horizon, int) and isinstance(rows, int) and horizon < rows:
        out.append(ConfigProblem(
            "kl_horizon", f"{horizon} is shorter than one batch of rollouts (batch_size * num_samples = {rows}): "
            f"each update would move kl_coeff by up to {20 * rows / horizon:.0f}% and overshoot the target",
            f"use >= {rows}; Ziegler et al.'s gain K_beta = 0.1 is {10 * rows} here (10 batches)",
        ))  # fmt: skip
    mb = cfg["minibatch_size"]
    if isinstance(mb, int) and isinstance(rows, int) and mb > 0 and rows % mb:
        out.append(ConfigProblem(
            "minibatch_size", f"{mb} does not divide batch_size * num_samples = {rows}",
            f"use a divisor of {rows}, or null for all {rows} in one step",
        ))  # fmt: skip
    return out


# Every key this recipe reads: validation, `tunebench validate`, the launcher and the Recipe screen read it.
CONFIG_SCHEMA = Schema(
    {
        **rollout_fields("output_dir", "seed"),
        **shared_fields("device", "dtype"),
        **rollout_fields("checkpoint_dir", "model"),
        "value_model": Field(dict, REQUIRED, "the trained value model: " + _SCORER, component=True),
        "value_checkpoint_dir": Field(
            str | None,
            None,
            "folder the value model starts from (null: reward_checkpoint_dir, else checkpoint_dir, fresh head)",
        ),  # fmt: skip
        "reward_model": Field(
            dict | None, None, "the frozen reward model (null with rewards): " + _SCORER, component=True
        ),  # fmt: skip
        "reward_checkpoint_dir": Field(
            str | None,
            None,
            "the reward model's *ForSequenceClassification folder (a reward_model run's model/)",
        ),
        "rewards": rollout(
            "rewards",
            "{name: _component_ reward fn} verifiable rewards instead of (or added to) the reward model",
        ),
        "reward_weights": rollout(
            "reward_weights", "{name: weight} for the verifiable rewards (default 1 each)"
        ),
        "tokenizer": shared(
            "tokenizer", "_component_ tokenizer ('demo' path for the embedded model's); shared"
        ),
        "dataset": shared(
            "dataset", "_component_ prompt dataset (prompt_dataset, demo_prompt_dataset, ...)", controls=()
        ),  # fmt: skip
        **rollout_fields("batch_size"),
        "num_samples": _POSITIVE.but(doc="completions sampled per prompt"),
        **rollout_fields("max_new_tokens", "temperature", "top_k", "top_p", "stop_tokens"),
        "missing_eos_penalty": Field(
            float | None, None, "subtracted from the score of a completion with no stop token (null: none)"
        ),
        "gamma": Field(float, 1.0, "GAE discount", minimum=0.0, maximum=1.0),
        "lam": Field(float, 0.95, "GAE lambda", minimum=0.0, maximum=1.0),
        "kl_coeff": Field(
            float, 0.05, "KL penalty coefficient (the starting value with kl_target)", minimum=0.0
        ),
        "kl_target": Field(
            float | None, None, "adaptive KL: steer the per-sequence KL to this (null: fixed)", above=0.0
        ),  # fmt: skip
        "kl_horizon": _POSITIVE.but(
            default=10000,
            doc="adaptive KL horizon in rollouts, >= batch_size * num_samples (Ziegler et al.: 10000)",
        ),
        "whiten_advantages": Field(bool, True, "normalise advantages over each batch (mean 0, std 1)"),
        "whiten_rewards": Field(bool, False, "scale per-token rewards to std 1 over each batch (mean kept)"),
        "ppo_epochs": _POSITIVE.but(doc="optimisation passes over each batch of rollouts"),
        "minibatch_size": Field(
            int | None, None, "completions per optimizer step (null: the whole batch)", minimum=1
        ),  # fmt: skip
        **rollout_fields("epochs", "max_steps_per_epoch"),
        "optimizer": shared(
            "optimizer", "_component_ optimizer over the policy's and value model's parameters"
        ),
        **rollout_fields("lr_scheduler"),
        **shared_fields("clip_grad_norm"),
        "loss": shared("loss", "_component_ engine.modules.loss.PPOLoss {epsilon, value_clip, value_coeff}"),
        **rollout_fields("num_samples_to_log", "enable_activation_checkpointing"),
        **shared_fields("compile"),
        **rollout_fields("save_every_n_steps"),
        **shared_fields("keep_last_n_checkpoints", "resume"),
    },
    checks=(_reward_problems,),
    max_nproc=1,
    nproc_note="PPO runs on one process",
    absent={
        "optimizer_in_bwd": _NO_BWD,
        "linear_ce": "PPOLoss works on per-token log-probs and values, not cross-entropy",
        "packing": "prompts are sampled into rollouts, not packed",
    },
    call_site_args=frozenset({"completions", "answers", "prompts"}),
)


@torch.no_grad()
def token_entropy(model: nn.Module, tokens: torch.Tensor, mask: torch.Tensor, *, temperature: float = 1.0,
                  chunk_size: int = 256) -> torch.Tensor:  # fmt: skip
    """Mean entropy (nats) of the policy's next-token distribution over the masked positions."""
    hidden = model.forward_hidden(tokens)  # [R,L,D]
    weight = model.output_weight
    total = torch.zeros((), dtype=torch.float64, device=tokens.device)
    for s in range(0, hidden.shape[1], chunk_size):
        logits = (hidden[:, s : s + chunk_size] @ weight.t()).float() / temperature  # [R,C,V]
        logp = torch.log_softmax(logits, dim=-1)
        ent = -(logp.exp() * logp).sum(-1)  # [R,C]
        total += (ent * mask[:, s : s + chunk_size]).sum().double()
    return (total / mask.sum().clamp(min=1)).float()


class PPORecipe:
    """PPO: `setup()`, `train()`, `save_checkpoint()`, `cleanup()`.

    Args:
        cfg (dict): resolved config. Raises ConfigError for values that cannot work (named).
    """

    def __init__(self, cfg: dict, *, dist_info=None) -> None:
        cfg = recipe_loop.start_recipe(self, CONFIG_SCHEMA, cfg, name="ppo", dist_info=dist_info)
        self.num_samples = int(cfg["num_samples"])
        self.max_new_tokens = int(cfg["max_new_tokens"])
        self.temperature = float(cfg["temperature"])
        self.ppo_epochs = int(cfg["ppo_epochs"])
        self.gamma, self.lam = float(cfg["gamma"]), float(cfg["lam"])
        for key, value in (("gamma", self.gamma), ("lam", self.lam)):
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"must be in [0, 1], got {value}", field=key)
        rows = self.batch_size * self.num_samples
        self.minibatch_size = int(cfg.get("minibatch_size") or rows)
        if self.temperature <= 0:
            raise ConfigError("PPO samples, so it must be > 0 (e.g. 1.0)", field="temperature")
        if rows % self.minibatch_size:
            raise ConfigError(
                f"{self.minibatch_size} does not divide batch_size * num_samples = {rows}",
                hint=f"use a divisor of {rows}, or null for all {rows} in one step",
                field="minibatch_size",
            )
        self.reward_nodes = dict(cfg.get("rewards") or {})
        self.reward_weights = dict(cfg.get("reward_weights") or {})
        if not self.reward_nodes and cfg.get("reward_model") is None:
            raise ConfigError(
                "PPO needs a reward",
                hint="set reward_model + reward_checkpoint_dir (a trained reward "
                "model), or rewards: {name: {_component_: engine.rl.rewards.math_reward}}",
                field="reward_model",
            )
        if cfg.get("reward_model") is not None and not cfg.get("reward_checkpoint_dir"):
            raise ConfigError(
                "missing",
                hint="point it at a trained reward model (a reward_model run's "
                "checkpoints/step_<N>/model/ or a *ForSequenceClassification folder)",
                field="reward_checkpoint_dir",
            )
        if "value_model" not in cfg:
            raise ConfigError(
                "missing",
                hint="add {_component_: engine.models.reward.reward_model, decoder: "
                "{_component_: <the policy's builder>}}",
                field="value_model",
            )
        self.missing_eos_penalty = cfg.get("missing_eos_penalty")
        self.optimizer_steps = 0
        self.history: list[dict[str, float]] = []

    # ------------------------------------------------------------------------------------ set-up
    def setup(self) -> None:
        from engine.modules.score_decoder import ScoreDecoder
        from engine.rl.ppo_advantages import AdaptiveKLController, FixedKLController

        recipe_loop.start_setup(self)
        cfg = self.cfg
        common = {"dtype": self.dtype, "seed": self.seed, "device": self.device,
                  "compile": bool(cfg["compile"])}  # fmt: skip
        ac = bool(cfg["enable_activation_checkpointing"])
        self.model, self.is_lora, self.model_dir = build_model(
            cfg["model"], cfg.get("checkpoint_dir"), trainable=True, activation_checkpointing=ac, **common
        )
        self.reference = None
        if not self.is_lora:
            self.reference, _, _ = build_model(
                cfg["model"], cfg.get("checkpoint_dir"), trainable=False, **common
            )
        self.reward_model = None
        if cfg.get("reward_model") is not None:
            self.reward_model, _, _ = build_model(
                cfg["reward_model"],
                cfg["reward_checkpoint_dir"],
                trainable=False,
                field="reward_model",
                dir_field="reward_checkpoint_dir",
                **common,
            )
            if not isinstance(self.reward_model, ScoreDecoder) or getattr(
                self.reward_model, "fresh_score_head", False
            ):
                raise ConfigError(
                    f"{cfg['reward_checkpoint_dir']} holds no trained score head",
                    hint="train one "
                    "with the reward_model recipe, and use reward_model: {_component_: engine.models.reward.reward_model}",
                    field="reward_checkpoint_dir",
                )
        value_key = next(
            (k for k in ("value_checkpoint_dir", "reward_checkpoint_dir", "checkpoint_dir") if cfg.get(k)),
            "checkpoint_dir",
        )  # the folder the value model starts from, and the key named if it is not one
        value_dir = cfg.get(value_key)
        self.value_model, self.value_is_lora, _ = build_model(
            cfg["value_model"],
            value_dir,
            trainable=True,
            activation_checkpointing=ac,
            field="value_model",
            dir_field=value_key,
            **common,
        )
        if not isinstance(self.value_model, ScoreDecoder):
            raise ConfigError(
                "needs a score head",
                hint="use {_component_: engine.models.reward.reward_model, decoder: ...}",
                field="value_model",
            )
        for p in self.value_model.score.parameters():  # LoRA value model: its head trains in full
            p.requires_grad_(True)
        self.tokenizer = build_tokenizer(cfg["tokenizer"])
        for field, m in (
            ("model", self.model),
            ("value_model", self.value_model),
            ("reward_model", self.reward_model),
        ):
            if m is not None:
                check_vocab(m, self.tokenizer, field=field)
        self.stop_tokens = sorted(
            set(self.tokenizer.stop_tokens) | {int(t) for t in cfg.get("stop_tokens") or []}
        )
        self._setup_data()
        # one module holding everything trained, so checkpoints and resume cover the value model too
        self.trainable = nn.ModuleDict({"policy": self.model, "value": self.value_model})
        # The schedule counts optimizer steps: ppo_epochs passes over each rollout step's minibatches.
        per_step = self.ppo_epochs * (self.batch_size * self.num_samples // self.minibatch_size)
        self.optimizer, self.lr_scheduler = build_optimizer(
            self.trainable,
            cfg["optimizer"],
            cfg["lr_scheduler"],
            num_training_steps=self.total_steps * per_step,
        )
        self.loss_fn = instantiate(cfg.get("loss") or {"_component_": "engine.modules.loss.PPOLoss"})
        # MoE policy / value model: each one's load balancing joins the loss (engine.training.router_aux)
        self.router_aux = RouterAuxLoss(self.model)
        self.value_router_aux = RouterAuxLoss(self.value_model, name="loss/aux_value")
        kl_coeff, target = float(cfg["kl_coeff"]), cfg.get("kl_target")
        self.kl_ctl = (
            FixedKLController(kl_coeff)
            if target is None
            else AdaptiveKLController(kl_coeff, float(target), int(cfg["kl_horizon"]))
        )
        self.generator = torch.Generator(device=self.device).manual_seed(self.seed + 1)
        state = resume_training(self, "optimizer_steps", trained=self.trainable)
        if state is not None:
            self.kl_ctl.value = float(state.get("kl_coeff", self.kl_ctl.value))
            if state.get("generator") is not None:
                self.generator.set_state(state["generator"])
        self.stop.install()

    def _setup_data(self) -> None:
        self.loader = prompt_loader(
            self.cfg["dataset"], self.tokenizer, batch_size=self.batch_size, seed=self.seed, recipe="PPO"
        )
        self.sampler = self.loader.batch_sampler
        per_epoch, most = len(self.sampler), self.cfg["max_steps_per_epoch"]
        per_epoch = per_epoch if most is None else min(per_epoch, int(most))
        self.steps_per_epoch = per_epoch
        self.total_steps = per_epoch * self.epochs

    # ------------------------------------------------------------------------------------ one step
    def rollout(self, prompts: list[list[int]], answers: list[str]) -> dict:
        """Sample, score (reward model and/or verifiable rewards, EOS penalty) and tensorise one batch."""
        from engine.generation import generate
        from engine.modules.score_decoder import last_non_pad_index, sequence_scores
        from engine.rl.rollout import rollout_attention_mask, rollout_batch, score

        rep_prompts = [list(p) for p in prompts for _ in range(self.num_samples)]
        rep_answers = [a for a in answers for _ in range(self.num_samples)]
        t0 = time.perf_counter()
        out = generate(
            self.model, rep_prompts, max_new_tokens=self.max_new_tokens, temperature=self.temperature,
            top_k=self.cfg.get("top_k"), top_p=self.cfg.get("top_p"), stop_tokens=self.stop_tokens,
            pad_id=self.tokenizer.pad_id, generator=self.generator,
        )  # fmt: skip
        gen_time = time.perf_counter() - t0
        completions = [list(map(int, c)) for c in out.completions]
        texts = [self.tokenizer.decode(c) for c in completions]
        prompt_texts = [self.tokenizer.decode(p) for p in rep_prompts]
        tokens, labels, mask = (
            t.to(self.device) for t in rollout_batch(rep_prompts, completions, self.tokenizer.pad_id)
        )
        real = rollout_attention_mask(rep_prompts, completions, tokens.shape[1]).to(self.device)
        R = tokens.shape[0]
        scores = torch.zeros(R, device=self.device)
        per_reward: dict[str, torch.Tensor] = {}
        if self.reward_nodes:
            total, per_reward = score(
                self.reward_nodes, self.reward_weights, texts, rep_answers, prompt_texts
            )
            scores += total.to(self.device)
        with torch.no_grad():
            if self.reward_model is not None:
                # the last non-pad token, as the reward_model recipe trained it and transformers reads it
                last = last_non_pad_index(tokens, self.tokenizer.pad_id)
                rm = sequence_scores(self.reward_model(tokens), last)[:, 0].float()
                per_reward["reward_model"] = rm.cpu()
                scores += rm
        ended = torch.tensor([bool(c) and c[-1] in self.stop_tokens for c in completions], device=self.device)
        raw = scores.clone()
        if self.missing_eos_penalty is not None:
            scores = scores - float(self.missing_eos_penalty) * (~ended).float()
        return {"prompts": rep_prompts, "completions": completions, "texts": texts, "prompt_texts": prompt_texts,
                "answers": rep_answers, "tokens": tokens, "labels": labels, "mask": mask, "real": real, "scores": scores,
                "raw_scores": raw, "per_reward": per_reward, "ended": ended, "gen_time": gen_time}  # fmt: skip

    def train_on(self, ro: dict) -> dict[str, float]:
        """Old/reference log-probs, values, KL-shaped rewards, GAE, then `ppo_epochs` x minibatch steps."""
        from engine.rl.ppo_advantages import gae, kl_penalised_rewards, masked_mean, mean_sequence_kl, whiten
        from engine.training.logprobs import token_logprobs
        from engine.training.model_setup import reference_context

        tokens, labels, mask = ro["tokens"], ro["labels"], ro["mask"]
        lp = {"temperature": self.temperature}
        self.model.eval()
        self.value_model.eval()
        with torch.no_grad():
            old = token_logprobs(self.model, tokens, labels, **lp)  # [R,L]
            ref_model, ctx = reference_context(self.model, self.reference)
            with ctx:
                ref = token_logprobs(ref_model, tokens, labels, **lp)
            old_values = (
                self.value_model(tokens)[..., 0].float() * mask
            )  # [R,L]: value before each response token
            entropy = token_entropy(self.model, tokens, mask, temperature=self.temperature)
            rewards, kl = kl_penalised_rewards(ro["scores"], old, ref, mask, self.kl_ctl.value)
            if self.cfg["whiten_rewards"]:
                rewards = whiten(rewards, mask, shift_mean=False)
            adv, returns = gae(rewards, old_values, mask, gamma=self.gamma, lam=self.lam)
            if self.cfg["whiten_advantages"]:
                adv = whiten(adv, mask)
        self.model.train()
        self.value_model.train()
        keys = ("policy_loss", "value_loss", "clip_fraction", "value_clip_fraction", "approx_kl", "ratio")
        sums = dict.fromkeys(("loss", "grad_norm", *keys), 0.0)
        n = 0
        R = tokens.shape[0]
        perm_gen = torch.Generator().manual_seed(self.seed + 7 * self.global_step)
        params = [p for p in self.trainable.parameters() if p.requires_grad]
        for _ in range(self.ppo_epochs):
            order = torch.randperm(R, generator=perm_gen) if self.minibatch_size < R else torch.arange(R)
            for s in range(0, R, self.minibatch_size):
                idx = order[s : s + self.minibatch_size].to(self.device)
                logps = token_logprobs(self.model, tokens[idx], labels[idx], **lp)
                aux = self.router_aux.term(ro["real"][idx])  # MoE: prompt + completion tokens
                values = self.value_model(tokens[idx])[..., 0].float()
                aux = aux + self.value_router_aux.term(ro["real"][idx])
                loss, stats = self.loss_fn(
                    logps, old[idx], adv[idx], values, old_values[idx], returns[idx], mask[idx]
                )
                recipe_loop.check_finite_loss(loss.item(), self.global_step + 1)
                (loss + aux).backward()
                _, gn = recipe_loop.optimizer_step(
                    params, self.optimizer, self.lr_scheduler, self.clip_grad_norm
                )
                self.optimizer_steps += 1
                sums["loss"] += loss.item()
                sums["grad_norm"] += gn
                for k in keys:
                    sums[k] += float(stats[k])
                n += 1
        seq_kl = mean_sequence_kl(kl)  # nats per sequence: kl_target's units
        out = (
            {k: v / n for k, v in sums.items()} | self.router_aux.metrics() | self.value_router_aux.metrics()
        )
        out.update({"kl": seq_kl, "kl_coeff": self.kl_ctl.value, "entropy": float(entropy),
                    "value/mean": float(masked_mean(old_values, mask)),
                    "advantages/abs_mean": float(masked_mean(adv.abs(), mask))})  # fmt: skip
        self.kl_ctl.update(seq_kl, R)  # n_steps = this batch's rollouts (kl_horizon counts rollouts)
        return out

    def _log_samples(self, ro: dict) -> None:
        k = int(self.cfg["num_samples_to_log"])
        if k <= 0:
            return
        rows = [{"step": self.global_step, "prompt": ro["prompt_texts"][i], "completion": ro["texts"][i],
                 "answer": ro["answers"][i], "reward": float(ro["scores"][i])}
                for i in range(min(k, len(ro["texts"])))]  # fmt: skip
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / "samples.jsonl", "a", encoding="utf-8") as f:
            f.write("\n".join(json.dumps(r) for r in rows) + "\n")  # whole lines in one write
        self.logger.event(self.global_step, "sample", json.dumps(rows[0])[:2000])

    def step_on(self, ro: dict, t0: float) -> dict[str, float]:
        """Train on one rollout, advance `global_step`, log the step's metrics and samples."""
        train_stats = self.train_on(ro)
        self.global_step += 1
        lengths = torch.tensor([len(c) for c in ro["completions"]], dtype=torch.float32)
        scores = ro["scores"].float().cpu()
        metrics = {
            "reward": float(scores.mean()),
            "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
            "reward/raw": float(ro["raw_scores"].mean()),
            **{f"rewards/{k}": float(v.mean()) for k, v in ro["per_reward"].items()},
            **train_stats,
            "response_length": float(lengths.mean()),
            "missing_eos": float((~ro["ended"]).float().mean()),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "rollout_tokens_per_sec": float(lengths.sum()) / max(ro["gen_time"], 1e-9),
            "step_time": time.perf_counter() - t0,
            "epoch": self.epoch,
        }
        recipe_loop.log_step(self, metrics)
        self.history.append(metrics)
        self._log_samples(ro)
        return metrics

    def train(self) -> int:
        """Run to the end (0), to a SIGTERM (checkpoint, 0), or to a NaN loss (`LossIsNaN`)."""
        log = self.logger
        log.set_progress(self.global_step, self.total_steps)
        while self.epoch < self.epochs and self.global_step < self.total_steps:
            self.sampler.set_epoch(self.epoch, skip=self.batches_in_epoch)
            for batch in self.loader:
                if self.batches_in_epoch >= self.steps_per_epoch:
                    break
                t0 = time.perf_counter()
                ro = self.rollout(batch["prompts"], batch["answers"])
                self.batches_in_epoch += 1
                self.step_on(ro, t0)
                if self.batches_in_epoch >= self.steps_per_epoch:
                    break
                if recipe_loop.save_or_stop(self):
                    return 0
            if recipe_loop.end_epoch(self):
                return 0
        return 0

    # --------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        """`output_dir/checkpoints/step_<N>/`: the policy (adapters or HF folder) in `model/`, policy and
        value weights + optimizer in `state/`, recipe state (KL coefficient, sampler, generator)."""
        extra = {"kl_coeff": self.kl_ctl.value, "generator": self.generator.get_state()}
        return save_training_checkpoint(self, "optimizer_steps", extra=extra, trained=self.trainable)

    def cleanup(self) -> None:
        recipe_loop.close_logger(self.logger)


# the config check before anything is built, and `--config FILE [overrides]` (exit codes 0/1/2)
check_config, recipe_main = recipe_entry("ppo", PPORecipe)


if __name__ == "__main__":
    recipe_main()
