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
mismatched prompt/response rows of the same micro-batch (one more policy and reference forward, no grad).
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

import math
import time
from functools import partial
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from engine.checkpoint.recipe_state import load_resume_state, save_training_checkpoint
from engine.config import ConfigError, instantiate
from engine.config.recipe_schema import Schema
from engine.data.sampler import EpochBatchSampler
from engine.modules.loss.kto_loss import KTOLoss
from engine.recipes._entry import LossIsNaN, refuse_config_problems, run_recipe_main
from engine.recipes._fields import shared, shared_fields
from engine.training.distributed import all_reduce_sum, rank_world
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
from engine.training.runtime import parse_dtype, pick_device, set_seed
from engine.training.stop_flag import StopFlag

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
            "_component_ DPOLoss {beta, label_smoothing, loss_type}, ORPOLoss, SimPOLoss or KTOLoss (engine.modules.loss)",
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
        self.cfg = cfg = CONFIG_SCHEMA.check(cfg)  # every key checked, defaults filled in
        self.dist_info = dist_info
        self.rank, self.world_size = rank_world()
        self.device = pick_device(cfg["device"])
        if dist_info is not None and self.device.type == "cuda":
            self.device = dist_info.device
        self.dtype = parse_dtype(cfg["dtype"])
        self.output_dir = Path(cfg["output_dir"] or "./runs/dpo")
        self.seed = int(cfg["seed"])
        self.batch_size = int(cfg["batch_size"])
        self.accum = int(cfg["gradient_accumulation_steps"])
        self.epochs = int(cfg["epochs"])
        self.keep_last = int(cfg["keep_last_n_checkpoints"])
        self.clip_grad_norm = cfg["clip_grad_norm"]
        self.save_every = cfg["save_every_n_steps"]
        self.global_step = self.epoch = self.batches_in_epoch = 0
        self.tokens_total = 0
        self.stop = StopFlag()
        self.logger = None
        self.history: list[dict[str, float]] = []  # rank 0's step metrics of this process (tests)

    # ------------------------------------------------------------------------------------ set-up
    def setup(self) -> None:
        from engine.tracking import MetricLogger

        set_seed(self.seed)
        self.logger = MetricLogger.from_env(rank=self.rank)
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
        self._maybe_resume()
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
        if self.unpaired and self.batch_size < 2:
            raise ConfigError(
                "KTO on unpaired data needs >= 2 examples per micro-batch (its KL estimate pairs each prompt "
                "with another example's completion)",
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
        per_epoch = len(self.sampler) // self.accum
        if per_epoch < 1:
            raise ConfigError(
                f"{self.accum} micro-batches exceed an epoch of {len(self.sampler)}",
                hint="lower it or the batch size, or use more pairs",
                field="gradient_accumulation_steps",
            )
        if self.cfg["max_steps_per_epoch"] is not None:
            per_epoch = min(per_epoch, int(self.cfg["max_steps_per_epoch"]))
        self.steps_per_epoch = per_epoch
        self.total_steps = per_epoch * self.epochs

    def _maybe_resume(self) -> None:
        state = load_resume_state(
            self.cfg, output_dir=self.output_dir, model=self.model, optimizer=self.optimizer,
            lr_scheduler=self.lr_scheduler, logger=self.logger, rank=self.rank,
        )  # fmt: skip
        if state is None:
            return
        self.global_step, self.epoch = int(state["step"]), int(state["epoch"])
        self.batches_in_epoch = int(state["batches_in_epoch"])
        self.tokens_total = int(state.get("tokens_total", 0))

    # ------------------------------------------------------------------------------------ training
    def _sequence_logps(self, model, batch: dict) -> torch.Tensor:
        """Summed response log-probs `[2B]` (chosen rows first) of one micro-batch."""
        tokens = torch.cat([batch["chosen_tokens"], batch["rejected_tokens"]])  # [2B,S]
        labels = torch.cat([batch["chosen_labels"], batch["rejected_labels"]])  # [2B,S], shifted
        positions = torch.cat([batch["chosen_position_ids"], batch["rejected_position_ids"]])
        return token_logprobs(model, tokens, labels, position_ids=positions).sum(dim=1)

    def _losses(self, batch: dict, logps: torch.Tensor, B: int):
        """`(losses, chosen_rewards [B], rejected_rewards [B], extra metrics)` for the configured loss."""
        from engine.modules.loss.kto_loss import mismatched_pairs

        if self.reference_free:
            lengths = torch.cat([batch["chosen_labels"], batch["rejected_labels"]]).ne(-100).sum(1)
            losses, r_c, r_r = self.loss_fn(logps[:B], logps[B:], lengths[:B], lengths[B:])
            return losses, r_c, r_r, {}
        ref_model, ctx = reference_context(self.model, self.reference)
        with torch.no_grad(), ctx:
            ref_logps = self._sequence_logps(ref_model, batch)
        if not isinstance(self.loss_fn, KTOLoss):
            losses, r_c, r_r = self.loss_fn(logps[:B], logps[B:], ref_logps[:B], ref_logps[B:])
            return losses, r_c, r_r, {}
        # KTO: 2B unpaired examples; z0 from row i's prompt with row i+1's response (no grad)
        tokens = torch.cat([batch["chosen_tokens"], batch["rejected_tokens"]])
        labels = torch.cat([batch["chosen_labels"], batch["rejected_labels"]])
        kl_tokens, kl_labels = mismatched_pairs(tokens, labels, self.tokenizer.pad_id)
        with torch.no_grad():
            kl_policy = token_logprobs(self.model, kl_tokens, kl_labels).sum(1)
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
        from engine.modules.loss.kto_loss import mismatched_pairs

        tokens, labels, good = batch["tokens"], batch["labels"], batch["desirable"]
        logps = token_logprobs(self.model, tokens, labels, position_ids=batch["position_ids"]).sum(1)  # [N]
        aux = self.router_aux.term(batch["source_ids"] >= 0)  # padding has source id -1
        ref_model, ctx = reference_context(self.model, self.reference)
        kl_tokens, kl_labels = mismatched_pairs(tokens, labels, self.tokenizer.pad_id)
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
        from engine.training import clip_grad_norm, memory_stats, reset_peak_memory
        from engine.training.multinode import per_rank_memory

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
                if not math.isfinite(step_loss):
                    raise LossIsNaN(
                        f"loss is {'nan' if math.isnan(step_loss) else 'inf'} at step {self.global_step + 1}"
                    )
                grad_norm = clip_grad_norm(
                    self.model.parameters(),
                    float(self.clip_grad_norm) if self.clip_grad_norm is not None else None,
                )
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                lr = self.optimizer.param_groups[0]["lr"]
                if self.lr_scheduler is not None:
                    self.lr_scheduler.step()
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
                    "lr": float(lr),
                    "grad_norm": float(
                        grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
                    ),
                    "tokens_per_sec": t[7] / max(time.perf_counter() - t0, 1e-9),
                    "tokens_total": self.tokens_total,
                    "epoch": self.epoch,
                }
                if isinstance(self.loss_fn, KTOLoss):
                    metrics["kl"] = kl_sum / self.accum
                metrics.update(self.router_aux.metrics())  # MoE: `loss/aux`, the mean load-balancing loss
                kl_sum = 0.0
                # every rank's own figures, under its rank (several nodes: rank 0 logs all of them)
                for rank, memory in per_rank_memory(memory_stats(self.device), self.device).items():
                    log.log(self.global_step, {**metrics, **memory} if rank == 0 else memory, rank=rank)
                self.history.append(metrics)
                log.set_progress(self.global_step, self.total_steps)
                stats.zero_()
                if step_in_epoch >= self.steps_per_epoch:
                    break
                stop = self.stop.requested_anywhere(self.device)
                if stop or (self.save_every and self.global_step % int(self.save_every) == 0):
                    self.save_checkpoint()
                if stop:
                    log.event(self.global_step, "stopped", "stopped by SIGTERM after a checkpoint")
                    return 0
                t0 = time.perf_counter()
            self.epoch += 1
            self.batches_in_epoch = 0
            self.save_checkpoint()
            if self.stop.requested_anywhere(self.device):
                log.event(self.global_step, "stopped", "stopped by SIGTERM after a checkpoint")
                return 0
        return 0

    def save_checkpoint(self) -> Path:
        """`output_dir/checkpoints/step_<N>/`: the model (adapters or an HF folder), optimizer, recipe state."""
        return save_training_checkpoint(
            self,
            {
                "epoch": self.epoch,
                "batches_in_epoch": self.batches_in_epoch,
                "tokens_total": self.tokens_total,
            },
        )

    def cleanup(self) -> None:
        if self.logger is not None:
            self.logger.flush()
            self.logger.close()


# Refuse a config with problems before anything is built (ConfigError: the first, and how many more).
check_config = partial(refuse_config_problems, recipe="dpo")


def recipe_main(argv: list[str] | None = None) -> None:
    """Entry point: `--config FILE [overrides]`; every rank ends with its exit code (0, 1 NaN, 2 config)."""
    run_recipe_main(argv, name="dpo", recipe_cls=DPORecipe, check_config=check_config)


if __name__ == "__main__":
    recipe_main()
