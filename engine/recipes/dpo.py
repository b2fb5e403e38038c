"""Preference optimisation (DPO / IPO / hinge, ORPO, SimPO, KTO): full or LoRA, one process or many (FSDP2).

    python -m engine.recipes.dpo --config configs/demo/smollm2_135m_lora_dpo.yaml
    torchrun --nproc_per_node 2 -m engine.recipes.dpo --config configs/qwen2_5/0.5B_lora_dpo.yaml

Each micro-batch runs chosen and rejected responses through the policy in ONE forward (`[2B,S]`,
rows 0..B-1 chosen), sums their response-token log-probs, does the same under the reference without
gradients, and applies `loss` (engine.modules.loss.DPOLoss). The reference is a frozen copy of the
starting model (full fine-tuning) or the policy with its adapters disabled (LoRA: no second copy).
Reference-free losses (`ORPOLoss`, `SimPOLoss`: `loss_fn.reference_free`) get the summed log-probs and
response lengths instead, and no reference is built or run. `KTOLoss` treats every pair as two
unpaired examples (chosen desirable, rejected undesirable) and estimates its KL reference point from
mismatched prompt/response rows of the same micro-batch (one more policy and reference forward, no grad;
on several ranks the global micro-batch's, all-reduced, so N ranks equal one process); it needs
`batch_size >= 2`.
With an unpaired dataset (`engine.data.unpaired_dataset`: prompt, completion, label rows) KTO runs on
its labelled completions as they are (`[B,S]`, a `desirable [B]` mask); only KTOLoss takes such data.

Logged per step: `loss`, `rewards/chosen`, `rewards/rejected`, `rewards/margin`, `rewards/accuracy`
(fraction of pairs whose chosen reward exceeds the rejected one; unpaired data: of the micro-batch's
(desirable, undesirable) couples whose desirable reward is higher), `logps/chosen`, `logps/rejected`,
`lr`, `grad_norm`, `tokens_per_sec`, memory. An MoE policy trains on `loss + router_aux_loss_coef *
load balancing` over both sequences' real tokens and logs the load-balancing loss as `loss/aux`.
Exit codes as in SFT: 0 done or stopped by SIGTERM
(checkpoint first), 1 NaN loss, 2 bad config (one line).
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from engine.checkpoint.recipe_state import resume_training, save_training_checkpoint
from engine.config import ConfigError, instantiate
from engine.config.recipe_schema import Schema
from engine.data.sampler import EpochBatchSampler
from engine.modules.loss.dpo_loss import DPOLoss
from engine.modules.loss.kto_loss import KTOLoss
from engine.recipes._entry import recipe_entry
from engine.recipes._fields import shared, shared_fields
from engine.training import recipe_loop
from engine.training.distributed import all_reduce_sum
from engine.training.logprobs import token_logprobs
from engine.training.model_setup import (
    build_model,
    build_tokenizer,
    check_sequence_length,
    check_vocab,
    reference_context,
)
from engine.training.optimizer_setup import build_optimizer
from engine.training.router_aux import RouterAuxLoss

_NO_BWD = "reads no optimizer_in_bwd (only sft steps the optimizer in backward)"

# Every key this recipe reads: validation, `tunebench validate`, the launcher and the Recipe screen read it.
CONFIG_SCHEMA = Schema(
    {
        **shared_fields("output_dir"),
        "seed": shared("seed", "seed for new parameters (adapters) and data order"),
        **shared_fields("device", "dtype"),
        "checkpoint_dir": shared(
            "checkpoint_dir",
            "Hugging Face model folder of the starting policy (and reference), 'demo', or null (random)",
        ),
        "model": shared(
            "model",
            "_component_ model builder; lora_* trains adapters and uses the adapter-free base as reference",
        ),
        "tokenizer": shared(
            "tokenizer", "_component_ tokenizer (load_tokenizer with path; 'demo' for the embedded model's)"
        ),
        "dataset": shared(
            "dataset",
            "_component_ preference dataset (preference_dataset, hh_rlhf_dataset, demo_preference_dataset, ...); "
            "KTOLoss also takes unpaired_dataset (prompt, completion, label)",
            controls=(),
        ),  # fmt: skip
        "batch_size": shared(
            "batch_size", "preference pairs (unpaired data: examples) per micro-batch on each rank"
        ),
        **shared_fields("gradient_accumulation_steps"),
        "epochs": shared("epochs", "passes over the pairs"),
        **shared_fields("max_steps_per_epoch"),
        "optimizer": shared(
            "optimizer",
            "_component_ optimizer; DPO wants small LRs (5e-7 full, 5e-6..5e-5 LoRA on real models)",
        ),
        **shared_fields("lr_scheduler", "clip_grad_norm"),
        "loss": shared(
            "loss",
            "_component_ DPOLoss {beta, label_smoothing, loss_type, ipo_normalize}, ORPOLoss, SimPOLoss or KTOLoss "
            "(engine.modules.loss)",
        ),
        "enable_activation_checkpointing": shared(
            "enable_activation_checkpointing",
            "recompute policy blocks in backward (less memory, ~30% slower)",
        ),
        **shared_fields("compile", "fsdp", "save_every_n_steps", "keep_last_n_checkpoints", "resume"),
        "shuffle": shared("shuffle", "shuffle pairs each epoch (seeded)"),
    },
    absent={
        "optimizer_in_bwd": _NO_BWD,
        "linear_ce": "its loss is DPOLoss on sequence log-probs, not cross-entropy",
        "packing": "preference pairs are padded, never packed",
    },
)


class DPORecipe:
    """Preference optimisation, one class: `setup()`, `train()`, `save_checkpoint()`, `cleanup()`.

    Args:
        cfg (dict): resolved config. dist_info: from `engine.training.init_distributed()`, or None.
    Raises:
        ConfigError: a config value that cannot work, naming the field.
    """

    def __init__(self, cfg: dict, *, dist_info=None) -> None:
        cfg = recipe_loop.start_recipe(self, CONFIG_SCHEMA, cfg, name="dpo", dist_info=dist_info)
        self.accum = int(cfg["gradient_accumulation_steps"])
        self.tokens_total = 0
        self.history: list[dict[str, float]] = []  # rank 0's step metrics of this process (tests)

    # ------------------------------------------------------------------------------------ set-up
    def setup(self) -> None:
        recipe_loop.start_setup(self)
        cfg = self.cfg
        common = {"dtype": self.dtype, "seed": self.seed, "device": self.device, "dist_info": self.dist_info,
                  "compile": bool(cfg["compile"]), "fsdp_cfg": cfg["fsdp"]}  # fmt: skip
        self.model, self.is_lora, self.model_dir = build_model(
            cfg["model"], cfg["checkpoint_dir"], trainable=True,
            activation_checkpointing=bool(cfg["enable_activation_checkpointing"]), **common,
        )  # fmt: skip
        node = cfg["loss"] or {"_component_": "engine.modules.loss.DPOLoss"}
        self.loss_fn = instantiate(node)
        self.reference_free = bool(getattr(self.loss_fn, "reference_free", False))
        self.reference = None
        if not self.is_lora and not self.reference_free:  # full fine-tuning: a frozen copy of the start
            self.reference, _, _ = build_model(cfg["model"], cfg["checkpoint_dir"], trainable=False, **common)
        self.tokenizer = build_tokenizer(cfg["tokenizer"])
        check_vocab(self.model, self.tokenizer)
        self._setup_data()
        self.router_aux = RouterAuxLoss(self.model)  # MoE policy: load balancing joins the loss
        self.optimizer, self.lr_scheduler = build_optimizer(
            self.model, cfg["optimizer"], cfg["lr_scheduler"], num_training_steps=self.total_steps
        )
        resume_training(self, "tokens_total")
        self.stop.install()

    def _setup_data(self) -> None:
        from engine.data import build_dataset
        from engine.data.collate import padded_collate_dpo
        from engine.data.unpaired import padded_collate_unpaired

        dataset = build_dataset(self.cfg["dataset"], self.tokenizer)
        check_sequence_length(self.model, dataset)
        self.unpaired = bool(len(dataset)) and "desirable" in dataset[0]
        if self.unpaired and not isinstance(self.loss_fn, KTOLoss):
            raise ConfigError(
                f"unpaired data (prompt, completion, label) needs loss KTOLoss, not {type(self.loss_fn).__name__}",
                hint="set loss._component_: engine.modules.loss.KTOLoss or use a preference dataset",
                field="dataset",
            )
        if isinstance(self.loss_fn, KTOLoss) and self.batch_size < 2:
            # paired data with 1 pair: row i+1 of [chosen; rejected] is the same prompt's other answer
            what = "examples" if self.unpaired else "pairs"
            raise ConfigError(
                f"KTO needs >= 2 {what} per micro-batch, got {self.batch_size} (its KL estimate pairs each "
                "prompt with another prompt's completion)",
                hint="raise it to 4 or more",
                field="batch_size",
            )
        if len(dataset) and not self.unpaired and "chosen_tokens" not in dataset[0]:
            raise ConfigError(
                "DPO needs preference pairs (chosen/rejected)",
                hint="use preference_dataset, hh_rlhf_dataset, stack_exchange_paired_dataset or "
                "demo_preference_dataset (KTOLoss: also unpaired_dataset)",
                field="dataset",
            )
        collate = padded_collate_unpaired if self.unpaired else padded_collate_dpo
        self.sampler = EpochBatchSampler(
            len(dataset), batch_size=self.batch_size, world_size=self.world_size, rank=self.rank,
            seed=self.seed, shuffle=bool(self.cfg["shuffle"]),
        )  # fmt: skip
        self.loader = DataLoader(
            dataset,
            batch_sampler=self.sampler,
            collate_fn=partial(collate, pad_id=self.tokenizer.pad_id),
        )
        per_epoch = recipe_loop.steps_per_epoch(
            len(self.sampler),
            self.accum,
            self.cfg["max_steps_per_epoch"],
            hint="lower it or the batch size, or use more pairs",
        )
        self.steps_per_epoch = per_epoch
        self.total_steps = per_epoch * self.epochs

    # ------------------------------------------------------------------------------------ training
    def _sequence_logps(self, model, batch: dict) -> torch.Tensor:
        """Summed response log-probs `[2B]` (chosen rows first) of one micro-batch."""
        tokens = torch.cat([batch["chosen_tokens"], batch["rejected_tokens"]])  # [2B,S]
        labels = torch.cat([batch["chosen_labels"], batch["rejected_labels"]])  # [2B,S], shifted
        positions = torch.cat([batch["chosen_position_ids"], batch["rejected_position_ids"]])
        return token_logprobs(model, tokens, labels, position_ids=positions).sum(dim=1)

    def _losses(self, batch: dict, logps: torch.Tensor, B: int):
        """`(losses, chosen_rewards [B], rejected_rewards [B], extra metrics)` for the configured loss."""
        from engine.modules.loss.kto_loss import global_mismatched_pairs

        if self.reference_free:
            lengths = torch.cat([batch["chosen_labels"], batch["rejected_labels"]]).ne(-100).sum(1)
            losses, r_c, r_r = self.loss_fn(logps[:B], logps[B:], lengths[:B], lengths[B:])
            return losses, r_c, r_r, {}
        ref_model, ctx = reference_context(self.model, self.reference)
        with torch.no_grad(), ctx:
            ref_logps = self._sequence_logps(ref_model, batch)
        if not isinstance(self.loss_fn, KTOLoss):
            lengths = {}  # DPOLoss: response lengths for normalised IPO (TRL's form)
            if isinstance(self.loss_fn, DPOLoss):
                n = torch.cat([batch["chosen_labels"], batch["rejected_labels"]]).ne(-100).sum(1)
                lengths = {"chosen_lengths": n[:B], "rejected_lengths": n[B:]}
            losses, r_c, r_r = self.loss_fn(logps[:B], logps[B:], ref_logps[:B], ref_logps[B:], **lengths)
            return losses, r_c, r_r, {}
        # KTO: 2B unpaired examples; z0 from row i's prompt with row i+1's response over the global
        # micro-batch (every rank's chosen rows, then every rank's rejected rows; no grad, all-reduced)
        kl_tokens, kl_labels = global_mismatched_pairs(
            [
                (batch["chosen_tokens"], batch["chosen_labels"]),
                (batch["rejected_tokens"], batch["rejected_labels"]),
            ],
            self.tokenizer.pad_id,
        )
        with torch.no_grad():
            kl_policy = token_logprobs(self.model, kl_tokens, kl_labels).sum(1)
            # a fresh context: LoRA's disable-adapters context was spent on ref_logps (enters once)
            ref_model, ctx = reference_context(self.model, self.reference)
            with ctx:
                kl_ref = token_logprobs(ref_model, kl_tokens, kl_labels).sum(1)
        desirable = torch.arange(2 * B, device=logps.device) < B
        losses, rewards, z0 = self.loss_fn(logps, ref_logps, desirable, kl_policy, kl_ref)
        return losses, rewards[:B], rewards[B:], {"kl": float(z0)}

    def _micro_batch(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, float, torch.Tensor | float]:
        """`(losses, stats [11], kl, aux)` of one micro-batch; stats as `train` sums them, `aux` the MoE
        policy's weighted auxiliary loss (0 for a dense one) to add to the mean loss."""
        if self.unpaired:
            return self._unpaired_micro_batch(batch)
        B = batch["chosen_tokens"].shape[0]
        logps = self._sequence_logps(self.model, batch)  # [2B]
        # the routers of this forward, before the reference (for LoRA the same module) runs
        aux = self.router_aux.term(
            torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]])
        )
        losses, r_c, r_r, extra = self._losses(batch, logps, B)
        # per pair (DPO, ORPO, SimPO: [B]) or per example (KTO: [2B]); equal counts per micro-batch
        stats = torch.stack([
            losses.detach().mean() * B, torch.tensor(float(B)), r_c.sum(), r_r.sum(), (r_c > r_r).sum(),
            logps[:B].detach().sum(), logps[B:].detach().sum(),
            (batch["chosen_labels"] != -100).sum() + (batch["rejected_labels"] != -100).sum(),
            torch.tensor(float(B)), torch.tensor(float(B)), torch.tensor(float(B)),
        ]).double()  # fmt: skip
        return losses, stats, extra.get("kl", 0.0), aux

    def _unpaired_micro_batch(
        self, batch: dict
    ) -> tuple[torch.Tensor, torch.Tensor, float, torch.Tensor | float]:
        """KTO on labelled completions: `tokens`/`labels [N,S]`, `desirable [N]`."""
        from engine.modules.loss.kto_loss import global_mismatched_pairs

        tokens, labels, good = batch["tokens"], batch["labels"], batch["desirable"]
        logps = token_logprobs(self.model, tokens, labels, position_ids=batch["position_ids"]).sum(1)  # [N]
        aux = self.router_aux.term(batch["source_ids"] >= 0)  # padding has source id -1
        ref_model, ctx = reference_context(self.model, self.reference)
        kl_tokens, kl_labels = global_mismatched_pairs([(tokens, labels)], self.tokenizer.pad_id)
        with torch.no_grad():
            kl_policy = token_logprobs(self.model, kl_tokens, kl_labels).sum(1)  # [N]
            with ctx:
                ref_logps = token_logprobs(ref_model, tokens, labels, position_ids=batch["position_ids"]).sum(
                    1
                )
                kl_ref = token_logprobs(ref_model, kl_tokens, kl_labels).sum(1)
        losses, rewards, z0 = self.loss_fn(logps, ref_logps, good, kl_policy, kl_ref)
        r_c, r_r = rewards[good], rewards[~good]
        N, lp = tokens.shape[0], logps.detach()
        stats = torch.stack([
            losses.detach().mean() * N, torch.tensor(float(N)), r_c.sum(), r_r.sum(),
            (r_c[:, None] > r_r[None, :]).sum(), lp[good].sum(), lp[~good].sum(), (labels != -100).sum(),
            good.sum(), (~good).sum(), torch.tensor(float(r_c.numel() * r_r.numel())),
        ]).double()  # fmt: skip
        return losses, stats, float(z0), aux

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
            # [loss sum, pairs (examples), chosen reward sum, rejected reward sum, correct, chosen logps,
            #  rejected logps, tokens, chosen count, rejected count, compared couples]
            stats = torch.zeros(11, dtype=torch.float64, device=self.device)
            kl_sum = 0.0  # KTO's reference point, summed over the step's micro-batches
            t0 = time.perf_counter()
            for batch in self.loader:
                if step_in_epoch >= self.steps_per_epoch:
                    break
                batch = {k: v.to(self.device) for k, v in batch.items() if torch.is_tensor(v)}
                losses, micro_stats, kl, aux = self._micro_batch(batch)
                ((losses.mean() + aux) / self.accum).backward()
                kl_sum += kl
                stats += micro_stats.to(stats.device)
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
                self.tokens_total += int(t[7])
                metrics = {
                    "loss": step_loss,
                    "rewards/chosen": t[2] / max(t[8], 1.0),
                    "rewards/rejected": t[3] / max(t[9], 1.0),
                    "rewards/margin": t[2] / max(t[8], 1.0) - t[3] / max(t[9], 1.0),
                    "rewards/accuracy": t[4] / max(t[10], 1.0),
                    "logps/chosen": t[5] / max(t[8], 1.0),
                    "logps/rejected": t[6] / max(t[9], 1.0),
                    "lr": lr,
                    "grad_norm": grad_norm,
                    "tokens_per_sec": t[7] / max(time.perf_counter() - t0, 1e-9),
                    "tokens_total": self.tokens_total,
                    "epoch": self.epoch,
                }
                if isinstance(self.loss_fn, KTOLoss):
                    metrics["kl"] = kl_sum / self.accum
                metrics.update(self.router_aux.metrics())  # MoE: `loss/aux`, the mean load-balancing loss
                kl_sum = 0.0
                recipe_loop.log_step(self, metrics)
                self.history.append(metrics)
                stats.zero_()
                if step_in_epoch >= self.steps_per_epoch:
                    break
                if recipe_loop.save_or_stop(self):
                    return 0
                t0 = time.perf_counter()
            if recipe_loop.end_epoch(self):
                return 0
        return 0

    def save_checkpoint(self) -> Path:
        """`output_dir/checkpoints/step_<N>/`: the model (adapters or an HF folder), optimizer, recipe state."""
        return save_training_checkpoint(self, "tokens_total")

    def cleanup(self) -> None:
        recipe_loop.close_logger(self.logger)


# the config check before anything is built, and `--config FILE [overrides]` (exit codes 0/1/2)
check_config, recipe_main = recipe_entry("dpo", DPORecipe)


if __name__ == "__main__":
    recipe_main()
