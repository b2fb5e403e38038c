"""Reward-model training (Bradley-Terry on preference pairs): full or LoRA, one process or many (FSDP2).

    python -m engine.recipes.reward_model --config configs/demo/smollm2_135m_reward_model.yaml

The model is a decoder with a scalar `score` head (`engine.models.reward.reward_model`); its reward
for a sequence is the head's value at its last non-pad token, as transformers'
`*ForSequenceClassification` reads it (the EOS / end of turn, unless the tokenizer pads with that same
token: then the token before it, as in transformers). The saved `config.json` carries the tokenizer's
`pad_token_id`, which transformers needs for that on batches of several rows.
Each micro-batch runs chosen and rejected responses in ONE `[2B,S]` forward and applies `loss`
(`engine.modules.loss.BradleyTerryLoss`: `-log sigmoid(r_c - r_r - margin)`). With LoRA the adapters
and the (fresh) head are trained; the head is always trained in full.

Logged per step: `loss`, `accuracy` (pairs with r_c > r_r), `margin` (mean r_c - r_r),
`rewards/chosen`, `rewards/rejected`, `lr`, `grad_norm`, `tokens_per_sec`, memory. With `validation`
(a held-out `fraction` of the pairs, or its own `dataset`): `val_loss`, `val_accuracy`, `val_margin`
every `every_n_steps` and at the end, and an eval result `held_out / reward_accuracy`. Checkpoints'
`model/` is a Hugging Face `*ForSequenceClassification` folder (adapters merged) that PPO's
`reward_checkpoint_dir` and transformers load. Exit codes as in SFT: 0, 1 NaN loss, 2 bad config.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from engine.checkpoint.recipe_state import resume_training, save_training_checkpoint
from engine.config import ConfigError, instantiate
from engine.config.recipe_schema import Field, Schema
from engine.data.sampler import EpochBatchSampler
from engine.recipes._entry import recipe_entry
from engine.recipes._fields import shared, shared_fields, validation_field
from engine.training import recipe_loop
from engine.training.distributed import all_reduce_sum
from engine.training.model_setup import build_model, build_tokenizer, check_sequence_length, check_vocab
from engine.training.optimizer_setup import build_optimizer

_NO_BWD = "reads no optimizer_in_bwd (only sft steps the optimizer in backward)"
_POSITIVE = Field(int, 1, "", minimum=1)

# Every key this recipe reads: validation, `tunebench validate`, the launcher and the Recipe screen read it.
CONFIG_SCHEMA = Schema(
    {
        **shared_fields("output_dir"),
        "seed": shared("seed", "seed for the fresh head, adapters and data order"),
        **shared_fields("device", "dtype"),
        "checkpoint_dir": shared(
            "checkpoint_dir",
            "HF folder to start from: a causal LM (fresh head) or a *ForSequenceClassification; 'demo'; null",
        ),
        "model": shared(
            "model",
            "_component_ engine.models.reward.reward_model {decoder: {_component_: <family builder or lora_*>}}",
        ),
        "tokenizer": shared(
            "tokenizer", "_component_ tokenizer (load_tokenizer with path; 'demo' for the embedded model's)"
        ),
        "dataset": shared(
            "dataset",
            "_component_ preference dataset (preference_dataset, hh_rlhf_dataset, demo_preference_dataset, ...)",
            controls=(),
        ),  # fmt: skip
        "validation": validation_field(
            what="pairs",
            share_of="the pairs",
            fraction=0.1,
            every_n_steps_doc="evaluate every N optimizer steps (and at the end)",
        ),
        "batch_size": shared("batch_size", "preference pairs per micro-batch on each rank"),
        **shared_fields("gradient_accumulation_steps"),
        "epochs": shared("epochs", "passes over the pairs"),
        **shared_fields("max_steps_per_epoch"),
        "optimizer": shared("optimizer", "_component_ optimizer (reward models: ~1e-5 full, ~1e-4 LoRA)"),
        **shared_fields("lr_scheduler", "clip_grad_norm"),
        "loss": shared(
            "loss", "_component_ engine.modules.loss.BradleyTerryLoss {margin, center_rewards_coeff}"
        ),
        **shared_fields(
            "enable_activation_checkpointing",
            "compile",
            "fsdp",
            "save_every_n_steps",
            "keep_last_n_checkpoints",
            "resume",
        ),  # fmt: skip
        "shuffle": shared("shuffle", "shuffle pairs each epoch (seeded)"),
    },
    absent={
        "optimizer_in_bwd": _NO_BWD,
        "linear_ce": "its loss is Bradley-Terry on scalar rewards, not cross-entropy",
        "packing": "preference pairs are padded, never packed",
    },
)


def pair_rewards(model, batch: dict, pad_id: int) -> torch.Tensor:
    """Rewards `[2B]` (chosen rows first) of one collated preference micro-batch: each row's score at
    its last token that is not `pad_id` (`last_non_pad_index`, transformers' rule)."""
    from engine.modules.score_decoder import last_non_pad_index, sequence_scores

    tokens = torch.cat([batch["chosen_tokens"], batch["rejected_tokens"]])  # [2B,S]
    positions = torch.cat([batch["chosen_position_ids"], batch["rejected_position_ids"]])
    scores = model(tokens, position_ids=positions)  # [2B,S,1]
    return sequence_scores(scores, last_non_pad_index(tokens, pad_id))[:, 0].float()


class RewardModelRecipe:
    """Bradley-Terry reward-model training: `setup()`, `train()`, `evaluate()`, `save_checkpoint()`,
    `cleanup()`.

    Args:
        cfg (dict): resolved config. dist_info: from `engine.training.init_distributed()`, or None.
    Raises:
        ConfigError: a config value that cannot work, naming the field.
    """

    def __init__(self, cfg: dict, *, dist_info=None) -> None:
        cfg = recipe_loop.start_recipe(self, CONFIG_SCHEMA, cfg, name="reward_model", dist_info=dist_info)
        self.accum = int(cfg["gradient_accumulation_steps"])
        self.tokens_total = 0
        self.history: list[dict[str, float]] = []  # rank 0's step metrics of this process (tests)
        self.val_history: list[dict[str, float]] = []

    # ------------------------------------------------------------------------------------ set-up
    def setup(self) -> None:
        from engine.modules.score_decoder import ScoreDecoder

        recipe_loop.start_setup(self)
        cfg = self.cfg
        self.model, self.is_lora, self.model_dir = build_model(
            cfg["model"], cfg["checkpoint_dir"], trainable=True, dtype=self.dtype, seed=self.seed,
            device=self.device, dist_info=self.dist_info, compile=bool(cfg["compile"]),
            fsdp_cfg=cfg["fsdp"],
            activation_checkpointing=bool(cfg["enable_activation_checkpointing"]),
        )  # fmt: skip
        if not isinstance(self.model, ScoreDecoder):
            raise ConfigError(
                "a reward model needs a score head",
                hint="use {_component_: engine.models.reward.reward_model, "
                "decoder: {_component_: <family builder>}}",
                field="model",
            )
        for p in self.model.score.parameters():  # LoRA: the fresh head trains in full
            p.requires_grad_(True)
        self.tokenizer = build_tokenizer(cfg["tokenizer"])
        check_vocab(self.model, self.tokenizer)
        self._setup_data()
        self.optimizer, self.lr_scheduler = build_optimizer(  # the head's and trainable weights
            self.model, cfg["optimizer"], cfg["lr_scheduler"], num_training_steps=self.total_steps
        )
        self.loss_fn = instantiate(cfg.get("loss") or {"_component_": "engine.modules.loss.BradleyTerryLoss"})
        resume_training(self, "tokens_total")
        self.stop.install()

    def _collate(self):
        from engine.data.collate import padded_collate_dpo

        return partial(padded_collate_dpo, pad_id=self.tokenizer.pad_id)

    def _setup_data(self) -> None:
        from engine.data import build_dataset
        from engine.training.holdout import validation_split

        dataset = build_dataset(self.cfg["dataset"], self.tokenizer)
        check_sequence_length(self.model, dataset)
        if len(dataset) and "chosen_tokens" not in dataset[0]:
            raise ConfigError(
                "a reward model trains on preference pairs (chosen/rejected)",
                hint="use preference_dataset, "
                "hh_rlhf_dataset, stack_exchange_paired_dataset or demo_preference_dataset",
                field="dataset",
            )
        val = self.cfg["validation"]  # None, or the block with its defaults filled in by the schema
        self.val_loader, self.val_every, self.val_max_batches = None, None, None
        if val:
            self.val_every, self.val_max_batches = val["every_n_steps"], val["max_batches"]
            dataset, val_set = validation_split(val, dataset, self.tokenizer, self.model, self.seed)
            # every rank scores its own slice of the held-out pairs; sums are all-reduced
            mine = list(range(self.rank, len(val_set), self.world_size))
            self.val_loader = DataLoader(
                torch.utils.data.Subset(val_set, mine), batch_size=self.batch_size, collate_fn=self._collate()
            )
        self.sampler = EpochBatchSampler(
            len(dataset), batch_size=self.batch_size, world_size=self.world_size, rank=self.rank,
            seed=self.seed, shuffle=bool(self.cfg["shuffle"]),
        )  # fmt: skip
        self.loader = DataLoader(dataset, batch_sampler=self.sampler, collate_fn=self._collate())
        per_epoch = recipe_loop.steps_per_epoch(
            len(self.sampler),
            self.accum,
            self.cfg["max_steps_per_epoch"],
            hint="lower it or the batch size, or use more pairs",
        )
        self.steps_per_epoch = per_epoch
        self.total_steps = per_epoch * self.epochs

    # ------------------------------------------------------------------------------------ training
    def _batch_stats(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """`(losses [B], stats [6])`: loss sum, pairs, correct, chosen sum, rejected sum, tokens."""
        B = batch["chosen_tokens"].shape[0]
        rewards = pair_rewards(self.model, batch, self.tokenizer.pad_id)
        r_c, r_r = rewards[:B], rewards[B:]
        losses = self.loss_fn(r_c, r_r)
        tokens = (batch["chosen_tokens"] != self.tokenizer.pad_id).sum() + (
            batch["rejected_tokens"] != self.tokenizer.pad_id
        ).sum()
        stats = torch.stack([
            losses.detach().sum(), torch.tensor(float(B), device=losses.device), (r_c > r_r).sum(),
            r_c.detach().sum(), r_r.detach().sum(), tokens,
        ]).double()  # fmt: skip
        return losses, stats

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out `val_loss`, `val_accuracy`, `val_margin` (all ranks; sums all-reduced)."""
        was_training = self.model.training
        self.model.eval()
        total = torch.zeros(6, dtype=torch.float64, device=self.device)
        for i, batch in enumerate(self.val_loader):
            if self.val_max_batches is not None and i >= int(self.val_max_batches):
                break
            batch = {k: v.to(self.device) for k, v in batch.items() if torch.is_tensor(v)}
            total += self._batch_stats(batch)[1]
        all_reduce_sum(total)
        self.model.train(was_training)
        t = total.tolist()
        n = max(t[1], 1.0)
        out = {"val_loss": t[0] / n, "val_accuracy": t[2] / n, "val_margin": (t[3] - t[4]) / n}
        if self.rank == 0:
            self.logger.log(self.global_step, out)
            self.logger.eval_result(self.global_step, "held_out", "reward_accuracy", out["val_accuracy"])
        self.val_history.append(out)
        return out

    def train(self) -> int:
        """Run to the end (0), to a SIGTERM (checkpoint, 0), or to a NaN loss (`LossIsNaN`)."""
        from engine.training import reset_peak_memory

        log = self.logger
        log.set_progress(self.global_step, self.total_steps)
        self.model.train()
        reset_peak_memory(self.device)
        while self.epoch < self.epochs and self.global_step < self.total_steps:
            self.sampler.set_epoch(self.epoch, skip=self.batches_in_epoch)
            step_in_epoch = self.batches_in_epoch // self.accum
            stats = torch.zeros(6, dtype=torch.float64, device=self.device)
            t0 = time.perf_counter()
            for batch in self.loader:
                if step_in_epoch >= self.steps_per_epoch:
                    break
                batch = {k: v.to(self.device) for k, v in batch.items() if torch.is_tensor(v)}
                losses, batch_stats = self._batch_stats(batch)
                (losses.sum() / (losses.shape[0] * self.accum)).backward()
                stats += batch_stats
                self.batches_in_epoch += 1
                if self.batches_in_epoch % self.accum:
                    continue
                # ---- one optimizer step ---------------------------------------------------------
                all_reduce_sum(stats)
                t = stats.tolist()
                n = max(t[1], 1.0)
                step_loss = t[0] / n
                recipe_loop.check_finite_loss(step_loss, self.global_step + 1)
                lr, grad_norm = recipe_loop.optimizer_step(
                    self.model.parameters(), self.optimizer, self.lr_scheduler, self.clip_grad_norm
                )
                self.global_step += 1
                step_in_epoch += 1
                self.tokens_total += int(t[5])
                metrics = {
                    "loss": step_loss,
                    "accuracy": t[2] / n,
                    "margin": (t[3] - t[4]) / n,
                    "rewards/chosen": t[3] / n,
                    "rewards/rejected": t[4] / n,
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "tokens_per_sec": t[5] / max(time.perf_counter() - t0, 1e-9),
                    "tokens_total": self.tokens_total,
                    "epoch": self.epoch,
                }
                recipe_loop.log_step(self, metrics)
                self.history.append(metrics)
                stats.zero_()
                if self.val_loader is not None and self.global_step % self.val_every == 0:
                    self.evaluate()
                if step_in_epoch >= self.steps_per_epoch:
                    break
                if recipe_loop.save_or_stop(self):
                    return 0
                t0 = time.perf_counter()
            if recipe_loop.end_epoch(self):
                return 0
        if self.val_loader is not None and (self.global_step % self.val_every or not self.val_history):
            self.evaluate()  # the final model's held-out accuracy
        return 0

    # --------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        """`output_dir/checkpoints/step_<N>/`: a HF *ForSequenceClassification folder + optimizer + state."""
        from engine.models.hf_config import num_labels_of, read_hf_config

        # The source's layout only when it is itself a reward model (a causal LM's has lm_head, no score).
        like = (
            self.model_dir
            if self.model_dir is not None and num_labels_of(read_hf_config(self.model_dir))
            else None
        )
        # transformers finds each row's last token by pad_token_id: a causal LM's config may lack it
        return save_training_checkpoint(
            self, "tokens_total", is_lora=False, model_dir=like,
            config_updates={"pad_token_id": self.tokenizer.pad_id},
        )  # fmt: skip

    def cleanup(self) -> None:
        recipe_loop.close_logger(self.logger)


# the config check before anything is built, and `--config FILE [overrides]` (exit codes 0/1/2)
check_config, recipe_main = recipe_entry("reward_model", RewardModelRecipe)


if __name__ == "__main__":
    recipe_main()
