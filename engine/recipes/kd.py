"""Knowledge distillation: a smaller student learns a teacher's token distributions (plus the labels).

    python -m engine.recipes.kd --config configs/qwen3/0.6B_kd.yaml
    python -m engine.recipes.kd --config configs/demo/tiny_kd.yaml

Teacher and student share the tokenizer (same vocabulary). Per micro-batch the teacher's final hidden
states are computed without gradients, the student's with, and `loss` (engine.modules.loss.KDLoss)
projects both to the vocabulary a chunk of tokens at a time: `(1 - kd_ratio) * CE + kd_ratio * KL`
(forward, reverse or symmetric), never holding either model's `[B,S,V]` logits. The student is full
or LoRA (a `lora_*` builder). The step's loss is the token mean over all its micro-batches.

Logged per step: `loss`, `loss/kd` (the KL term), `loss/ce`, `lr`, `grad_norm`, `tokens_per_sec`, memory.
An MoE student trains on `loss + router_aux_loss_coef * load balancing` (padding left out; plus the
z-loss when configured) and logs the load-balancing loss as `loss/aux`. One process.
Exit codes as in SFT: 0 done or stopped by SIGTERM (checkpoint first), 1 NaN loss, 2 bad config.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from engine.checkpoint.recipe_state import resume_training, save_training_checkpoint
from engine.config import ConfigError, instantiate
from engine.config.recipe_schema import Field, Schema
from engine.data.sampler import EpochBatchSampler
from engine.modules.neftune import set_neftune_alpha
from engine.recipes._entry import recipe_entry
from engine.recipes._fields import shared, shared_fields
from engine.training import recipe_loop
from engine.training.model_setup import (
    build_model,
    build_tokenizer,
    check_sequence_length,
    check_vocab,
    resolve_model_dir,
)
from engine.training.optimizer_setup import build_optimizer
from engine.training.router_aux import RouterAuxLoss
from engine.training.runtime import forward_replaced

_NO_BWD = "reads no optimizer_in_bwd (only sft steps the optimizer in backward)"

# Every key this recipe reads: validation, `tunebench validate`, the launcher and the Recipe screen read it.
CONFIG_SCHEMA = Schema(
    {
        **shared_fields("output_dir"),
        "seed": shared("seed", "seed for new parameters and data order"),
        "device": shared("device"),
        "dtype": shared("dtype", "fp32 or bf16 for both models"),
        "checkpoint_dir": shared(
            "checkpoint_dir", "the student's starting HF folder, 'demo', or null (random init)"
        ),
        "model": shared("model", "_component_ student builder (lora_* trains adapters only)"),
        "teacher_checkpoint_dir": Field(
            str | None, None, "the teacher's HF folder (or 'demo'); null only for tests (random teacher)"
        ),
        "teacher_model": shared(
            "model",
            "_component_ teacher builder (frozen); its vocab_size must equal the student's",
            controls=(),
        ),
        "tokenizer": shared("tokenizer", "_component_ tokenizer shared by both"),
        "dataset": shared("dataset", "_component_ SFT-style dataset (tokens + labels), or a list of them"),
        "batch_size": shared("batch_size", "samples per micro-batch"),
        **shared_fields("gradient_accumulation_steps"),
        "epochs": shared("epochs", "passes over the data"),
        **shared_fields("max_steps_per_epoch", "optimizer", "lr_scheduler", "clip_grad_norm"),
        "loss": shared(
            "loss",
            "_component_ engine.modules.loss.KDLoss {kind: forward|reverse|symmetric, kd_ratio, temperature, chunk_size}",
        ),
        "enable_activation_checkpointing": shared(
            "enable_activation_checkpointing", "recompute student blocks in backward"
        ),
        **shared_fields("compile", "save_every_n_steps", "keep_last_n_checkpoints", "resume", "shuffle"),
        "neftune_alpha": shared("neftune_alpha", "NEFTune noise on the student's input embeddings (0: off)"),
    },
    max_nproc=1,
    nproc_note="distillation runs on one process",
    absent={
        "optimizer_in_bwd": _NO_BWD,
        "linear_ce": "KDLoss needs the student's and teacher's logits (it chunks them itself)",
    },
)


class KDRecipe:
    """Distillation, one class: `setup()`, `train()`, `save_checkpoint()`, `cleanup()`.

    Raises ConfigError for a config that cannot work (named field): different vocabularies,
    several processes, bad sizes.
    """

    def __init__(self, cfg: dict, *, dist_info=None) -> None:
        cfg = recipe_loop.start_recipe(self, CONFIG_SCHEMA, cfg, name="kd", dist_info=dist_info)
        self.accum = int(cfg["gradient_accumulation_steps"])
        self.tokens_total = 0
        self.history: list[dict[str, float]] = []

    def setup(self) -> None:
        from engine.data import build_dataset
        from engine.data.collate import collate_for

        recipe_loop.start_setup(self)
        cfg = self.cfg
        common = {"dtype": self.dtype, "device": self.device, "compile": bool(cfg["compile"])}
        for key in ("checkpoint_dir", "teacher_checkpoint_dir"):  # named before any model is built
            if cfg.get(key) is not None:
                resolve_model_dir(cfg[key], field=key)
        self.model, self.is_lora, self.model_dir = build_model(
            cfg["model"], cfg["checkpoint_dir"], trainable=True, seed=self.seed,
            activation_checkpointing=bool(cfg["enable_activation_checkpointing"]), **common,
        )  # fmt: skip
        set_neftune_alpha(self.model, cfg["neftune_alpha"])  # the student only, in training mode
        self.teacher, _, _ = build_model(
            cfg["teacher_model"], cfg["teacher_checkpoint_dir"], trainable=False, seed=self.seed + 1,
            field="teacher_model", dir_field="teacher_checkpoint_dir", **common,
        )  # fmt: skip
        vs, vt = self.model.output_weight.shape[0], self.teacher.output_weight.shape[0]
        if vs != vt:
            raise ConfigError(
                f"vocabulary {vt} differs from the student's {vs}",
                hint="distil between models that share a tokenizer",
                field="teacher_model",
            )
        self.tokenizer = build_tokenizer(cfg["tokenizer"])
        check_vocab(self.model, self.tokenizer)
        dataset = build_dataset(cfg["dataset"], self.tokenizer)
        check_sequence_length(self.model, dataset)
        check_sequence_length(self.teacher, dataset, model_field="teacher_model")
        if len(dataset) and "labels" not in dataset[0] and "document_ids" not in dataset[0]:
            raise ConfigError("distillation needs token/label samples (an SFT dataset)", field="dataset")
        self.sampler = EpochBatchSampler(len(dataset), batch_size=self.batch_size, seed=self.seed,
                                         shuffle=bool(cfg["shuffle"]))  # fmt: skip
        self.loader = DataLoader(
            dataset,
            batch_sampler=self.sampler,
            collate_fn=collate_for(dataset, pad_id=self.tokenizer.pad_id),
        )
        per_epoch = recipe_loop.steps_per_epoch(
            len(self.sampler), self.accum, cfg["max_steps_per_epoch"], hint="lower it or the batch size"
        )
        self.steps_per_epoch, self.total_steps = per_epoch, per_epoch * self.epochs
        self.optimizer, self.lr_scheduler = build_optimizer(
            self.model, cfg["optimizer"], cfg["lr_scheduler"], num_training_steps=self.total_steps
        )
        self.loss_fn = instantiate(cfg["loss"] or {"_component_": "engine.modules.loss.KDLoss"})
        self.router_aux = RouterAuxLoss(self.model)  # MoE student: load balancing joins the loss
        resume_training(self, "tokens_total")
        self.stop.install()

    def losses(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`(loss, kd, ce)` token means of one micro-batch (see KDLoss)."""
        kw = {"position_ids": batch.get("position_ids"), "document_ids": batch.get("document_ids")}
        with torch.no_grad():
            t_hidden = self.teacher.forward_hidden(batch["tokens"], **kw)  # [B,S,Dt]
        t_weight = self.teacher.output_weight  # [V,Dt]
        model, loss_fn = self.model, self.loss_fn

        def hidden_then_loss(tokens, **k):
            s_hidden = model.forward_hidden(tokens, **k)  # [B,S,D]
            return loss_fn(s_hidden, model.output_weight, t_hidden, t_weight, batch["labels"])

        with forward_replaced(model, hidden_then_loss):
            return model(batch["tokens"], **kw)

    def train(self) -> int:
        """Run to the end (0), to a SIGTERM (checkpoint, 0), or to a NaN loss (`LossIsNaN`)."""
        log = self.logger
        log.set_progress(self.global_step, self.total_steps)
        self.model.train()
        while self.epoch < self.epochs and self.global_step < self.total_steps:
            self.sampler.set_epoch(self.epoch, skip=self.batches_in_epoch)
            step_in_epoch = self.batches_in_epoch // self.accum
            pending: list[dict] = []
            for batch in self.loader:
                if step_in_epoch >= self.steps_per_epoch:
                    break
                pending.append({k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()})
                self.batches_in_epoch += 1
                if len(pending) < self.accum:
                    continue
                # ---- one optimizer step over the collected micro-batches (token-mean weighting) ---
                t0 = time.perf_counter()
                counts = [int((b["labels"] != -100).sum()) for b in pending]
                total = max(sum(counts), 1)
                sums = [0.0, 0.0, 0.0]
                for b, n in zip(pending, counts, strict=True):
                    loss, kd, ce = self.losses(b)
                    # MoE student: its routers over the real tokens (padding has source id -1)
                    aux = self.router_aux.term(b["source_ids"] >= 0, weight=n / total)
                    ((loss + aux) * (n / total)).backward()
                    sums = [sums[0] + loss.item() * n, sums[1] + kd.item() * n, sums[2] + ce.item() * n]
                step_tokens = sum(b["tokens"].numel() for b in pending)
                pending = []
                step_loss = sums[0] / total
                recipe_loop.check_finite_loss(step_loss, self.global_step + 1)
                lr, gn = recipe_loop.optimizer_step(
                    self.model.parameters(), self.optimizer, self.lr_scheduler, self.clip_grad_norm
                )
                self.global_step += 1
                step_in_epoch += 1
                self.tokens_total += step_tokens
                metrics = {
                    "loss": step_loss, "loss/kd": sums[1] / total, "loss/ce": sums[2] / total, "lr": lr,
                    "grad_norm": gn, "tokens_per_sec": step_tokens / max(time.perf_counter() - t0, 1e-9),
                    "tokens_total": self.tokens_total, "epoch": self.epoch, **self.router_aux.metrics(),
                }  # fmt: skip
                recipe_loop.log_step(self, metrics)
                self.history.append(metrics)
                if step_in_epoch >= self.steps_per_epoch:
                    break
                if recipe_loop.save_or_stop(self):
                    return 0
            if recipe_loop.end_epoch(self):
                return 0
        return 0

    def save_checkpoint(self) -> Path:
        """`output_dir/checkpoints/step_<N>/`: the model (adapters or an HF folder), optimizer, recipe state."""
        return save_training_checkpoint(self, "tokens_total")

    def cleanup(self) -> None:
        recipe_loop.close_logger(self.logger)


# the config check before anything is built, and `--config FILE [overrides]` (exit codes 0/1/2)
check_config, recipe_main = recipe_entry("kd", KDRecipe)


if __name__ == "__main__":
    recipe_main()
