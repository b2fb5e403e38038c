"""Supervised fine-tuning: full, LoRA/DoRA and QLoRA, one process or many (FSDP2), CPU or CUDA.

    torchrun --nproc_per_node 2 -m engine.recipes.sft --config configs/llama3_2/1B_lora.yaml lr=1e-4
    python -m engine.recipes.sft --config configs/demo/smollm2_135m_lora.yaml

Everything is driven by the YAML config (keys in `CONFIG_SCHEMA`). The method follows from the model
component: a plain builder trains every weight, a `lora_*` builder trains adapters only, and
`quantize_base: true` (the `qlora_*` presets) keeps the frozen base in NF4.

The loss of an optimizer step is the mean over every non-ignored token of the step, whatever the
split into ranks and micro-batches: each micro-batch contributes its token-loss SUM, and the
gradients are scaled once by `dp x cp / tokens_in_step` before the update (FSDP2 averages over the
data-parallel and context-parallel ranks). Parallel degrees (`engine.training.device_mesh`): batches
are split over the dp = dp_replicate x dp_shard ranks, each cp rank takes its load-balanced slice of
every sequence, tp ranks share a batch. So 2 ranks x batch 2, 1 rank x batch 4, 1 rank x batch 2 x
accumulation 2, and tp=2 or cp=2 on batch 4 are the same run.

Exit codes: 0 finished or stopped by SIGTERM (a checkpoint is written first), 1 loss became NaN/inf
(`loss is nan at step N` on stderr; the last good checkpoint stays), 2 bad config (one line).

Length: over 500 lines because it holds the recipe's whole config declaration (`CONFIG_SCHEMA`, ~110
lines, one Field per key) next to the one training loop that reads it; the plumbing is in engine/training.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from engine.checkpoint.export import write_merged_model
from engine.checkpoint.recipe_state import resume_training, save_training_checkpoint
from engine.config import ConfigError, ConfigProblem, instantiate
from engine.config.recipe_schema import Field, Schema
from engine.data.collate import collate_for
from engine.data.sampler import EpochBatchSampler
from engine.modules.moe import weighted_aux_loss
from engine.modules.neftune import set_neftune_alpha
from engine.recipes._entry import recipe_entry
from engine.recipes._fields import neftune_problems, shared, shared_fields, validation_field
from engine.training import recipe_loop
from engine.training.device_mesh import check_parallel_degrees, parallel_dims
from engine.training.distributed import all_reduce_sum
from engine.training.holdout import validation_split
from engine.training.model_setup import (
    build_model,
    build_tokenizer,
    check_sequence_length,
    check_vocab,
)
from engine.training.optimizer_setup import build_optimizer
from engine.training.runtime import forward_replaced


def _optimizer_in_backward_problems(cfg: dict) -> list[ConfigProblem]:
    """optimizer_in_bwd with gradient accumulation or clipping (every backward updates the weights)."""
    from engine.training.optimizer_in_backward import check_optimizer_in_backward_allowed

    if cfg["optimizer_in_bwd"] is not True:
        return []
    try:
        check_optimizer_in_backward_allowed(
            gradient_accumulation_steps=cfg["gradient_accumulation_steps"],
            clip_grad_norm=cfg["clip_grad_norm"],
        )
    except ConfigError as exc:
        return [exc.problem]
    return []


def _parallel_problems(cfg: dict, nproc: int) -> list[ConfigProblem]:
    """The mesh degrees fit `nproc`, then `expert_parallel_dim` (divides the shard ranks and the
    model's experts; not on a dense model): checked by the launcher before any process starts."""
    from engine.training.expert_parallel import expert_parallel_problems

    return (
        check_parallel_degrees(cfg, nproc)
        or expert_parallel_problems(cfg, nproc)
        or _qlora_problems(cfg, nproc)
    )


def _qlora_problems(cfg: dict, nproc: int) -> list[ConfigProblem]:
    """QLoRA on several ranks: FSDP2 (+ HSDP, cp) shards the NF4 base, or pure tensor parallelism keeps
    it whole on every rank; both at once (tp > 1 with other ranks) is refused."""
    node = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    preset = str(node.get("_component_", "")).rsplit(".", 1)[-1].startswith("qlora_")
    nf4 = node.get("quantize_base", preset) is True
    if nproc > 1 and nf4 and (tp := cfg["tensor_parallel_dim"]) not in (1, nproc):
        return [
            ConfigProblem(
                "tensor_parallel_dim",
                f"QLoRA (NF4 base) on {nproc} ranks runs under FSDP2 (tensor_parallel_dim=1) or pure "
                f"tensor parallelism (tensor_parallel_dim={nproc}), not tensor parallelism "
                f"{tp} x {nproc // max(tp, 1)} data-parallel ranks",
                f"set tensor_parallel_dim=1 or {nproc}, or use a lora_* builder",
            )
        ]
    return []


_POSITIVE = Field(int, 1, "", minimum=1)

# Every key this recipe reads: validation, `tunebench validate`, the launcher and the Recipe screen read it.
CONFIG_SCHEMA = Schema(
    {
        **shared_fields(
            "output_dir", "seed", "device", "dtype", "checkpoint_dir", "model", "tokenizer", "dataset"
        ),
        "validation": validation_field(
            what="split",
            share_of="the training data",
            fraction=0.05,
            every_n_steps_doc="validate every N optimizer steps",
        ),
        **shared_fields(
            "batch_size",
            "gradient_accumulation_steps",
            "epochs",
            "max_steps_per_epoch",
            "optimizer",
            "lr_scheduler",
            "clip_grad_norm",
        ),  # fmt: skip
        "loss": shared(
            "loss",
            "_component_ loss: LinearCrossEntropyLoss (no [B,S,V] logits) or ChunkedCrossEntropyLoss",
            controls=("linear_ce",),
        ),  # fmt: skip
        "optimizer_in_bwd": Field(
            bool,
            False,
            "step each parameter in backward, never holding all gradients (no accumulation/clipping)",
            controls=("optimizer_in_bwd",),
        ),  # fmt: skip
        "enable_activation_checkpointing": shared("enable_activation_checkpointing"),
        "ac_every_k": _POSITIVE.but(doc="checkpoint every k-th block only (1 = every block)"),
        "enable_activation_offloading": Field(
            bool, False, "move saved activations to host memory (CUDA only)"
        ),
        **shared_fields("compile", "fsdp"),
        "data_parallel_replicate_dim": _POSITIVE.but(
            doc="HSDP replicas (across nodes; 1: none); mesh order dp_replicate, dp_shard, cp, tp"
        ),
        "data_parallel_shard_dim": Field(
            int, -1, "FSDP2 shard degree (-1: the ranks the other degrees leave)", minimum=-1
        ),
        "context_parallel_dim": _POSITIVE.but(
            doc="context-parallel degree: each sequence split over this many ranks, ring attention (1: none)"
        ),
        "tensor_parallel_dim": _POSITIVE.but(
            doc="tensor-parallel degree, innermost mesh dimension (1: none)"
        ),
        "expert_parallel_dim": _POSITIVE.but(
            doc="MoE: experts sharded over this many data-parallel shard ranks (1: none; divides the experts)"
        ),
        **shared_fields("save_every_n_steps", "keep_last_n_checkpoints"),
        "save_merged_model": Field(
            bool, False, "LoRA: also write the merged full model (transformers loads it) at the end"
        ),
        "resume": shared("resume"),
        "num_workers": Field(
            int, 0, "data-loader worker processes (0: load in the training process)", minimum=0
        ),
        "shuffle": shared("shuffle"),
        "neftune_alpha": shared("neftune_alpha"),
        "log_every_n_steps": _POSITIVE.but(doc="print a line every N steps when no tracker run is attached"),
    },
    checks=(_optimizer_in_backward_problems, neftune_problems),
    nproc_check=_parallel_problems,
)


class SFTRecipe:
    """Supervised fine-tuning, one class: `setup(cfg)`, `train()`, `save_checkpoint()`, `cleanup()`.

    Args:
        cfg (dict): the resolved config (`engine.config.load_config`).
    Raises:
        ConfigError: any config value that cannot work, with the field and what to change.
    """

    def __init__(self, cfg: dict, *, dist_info=None) -> None:
        cfg = recipe_loop.start_recipe(self, CONFIG_SCHEMA, cfg, name="sft", dist_info=dist_info)
        # One mesh (dp_replicate, dp_shard, cp, tp): batches are split over the dp = dp_replicate x
        # dp_shard data-parallel groups; cp and tp ranks of a group share its batch.
        self.dims = parallel_dims(cfg, self.world_size)
        from engine.training.expert_parallel import check_expert_parallel

        self.ep = check_expert_parallel(cfg, self.world_size)
        self.tp = self.dims.tp
        self.dp_size, self.dp_rank = self.dims.dp, self.dims.dp_rank(self.rank)
        self.cp_rank = self.dims.coordinates(self.rank)["cp"]
        # FSDP2 averages gradients over the dp x cp ranks (cp ranks see different tokens).
        self.grad_ranks = self.dims.dp * self.dims.cp
        self.accum = int(cfg["gradient_accumulation_steps"])
        self.max_steps_per_epoch = cfg["max_steps_per_epoch"]
        self.optimizer_in_bwd = bool(cfg["optimizer_in_bwd"])
        self.log_every = int(cfg["log_every_n_steps"])
        self.tokens_total = 0
        self.loss_history: list[float] = []  # rank 0's step losses of this process (tests, benchmarks)

    # ------------------------------------------------------------------------------------ set-up
    def setup(self) -> None:
        """Build everything, in dependency order, then restore a checkpoint when resuming."""
        recipe_loop.start_setup(self)
        # The model first: the optimizer needs its (sharded) trainable parameters, and the loss
        # needs to know whether it projects hidden states itself (linear CE) or gets logits.
        self.model = self._setup_model()
        if self.world_size > 1 and self.rank == 0:
            mode = "; loss parallel (vocab-sharded logits)" if self.loss_parallel else ""
            self.logger.event(0, "mesh", f"{self.dims.describe()}{mode}")
        # The tokenizer next: datasets tokenize with it and the collate pads with its pad id.
        self.tokenizer = build_tokenizer(self.cfg["tokenizer"])
        check_vocab(self.model, self.tokenizer)
        # The data before the optimizer: the LR schedule needs the number of steps per epoch.
        self._setup_data()
        self.optimizer, self.lr_scheduler = build_optimizer(
            self.model, self.cfg["optimizer"], self.cfg["lr_scheduler"], num_training_steps=self.total_steps,
            in_backward=self.optimizer_in_bwd,
        )  # fmt: skip
        self.loss_fn = self._setup_loss()
        # Resume last: it fills model, optimizer, scheduler, RNG and data position in place.
        resume_training(self, "tokens_total")
        self.stop.install()

    def _setup_model(self) -> nn.Module:
        """Build the model, load the starting weights, choose trainable parameters, parallelize
        (`build_model`: on several processes built on `meta`, sharded, filled from rank 0)."""
        from engine.modules.moe import moe_layers
        from engine.training.expert_parallel import expert_mesh as build_expert_mesh

        cfg = self.cfg
        if self.world_size > 1 and (nf4 := _qlora_problems(cfg, self.world_size)):
            raise ConfigError.from_problem(nf4[0])  # QLoRA: FSDP2 or pure tensor parallelism
        ac, every_k = cfg["enable_activation_checkpointing"], cfg["ac_every_k"]
        # QLoRA on several ranks: each rank builds the whole model itself (same seed); under pure TP
        # the NF4 base stays replicated (engine.training.tensor_parallel), else FSDP2 shards it.
        model, self.is_lora, self.model_dir = build_model(
            cfg["model"], cfg["checkpoint_dir"], dtype=self.dtype, seed=self.seed, device=self.device,
            trainable=True, mesh=self._mesh(), activation_checkpointing=(every_k if every_k > 1 else True) if ac else False,
            compile=cfg["compile"], fsdp_cfg=cfg["fsdp"],
            expert_mesh=build_expert_mesh(self.world_size, self.ep, self.device.type) if self.ep > 1 else None,
            replicate_quantized=self.world_size == self.tp,
        )  # fmt: skip
        set_neftune_alpha(model, cfg["neftune_alpha"])  # noise on the embeddings in training mode only
        # Under TP an untied output is vocab-sharded: loss parallel replaces the configured loss.
        self.loss_parallel = self.tp > 1 and getattr(model, "output", None) is not None
        self.is_moe = bool(moe_layers(model))
        if self.ep > 1 and self.rank == 0:
            experts = moe_layers(model)[0].num_experts
            print(f"expert parallel: {experts} experts over {self.ep} ranks ({experts // self.ep} per rank)")
        self.offload = contextlib.nullcontext()
        if cfg["enable_activation_offloading"]:
            from engine.training import ActivationOffloading

            if self.device.type != "cuda":
                raise ConfigError(
                    "needs a CUDA device (it moves activations to host memory)",
                    hint="set it to false on CPU",
                    field="enable_activation_offloading",
                )
            self.offload = ActivationOffloading(model)
        return model

    def _mesh(self):
        if self.world_size == 1:
            return None
        from engine.training import build_world_mesh

        return build_world_mesh(self.dist_info, self.dims)

    def _setup_data(self) -> None:
        """Training split, optional held-out split, the resumable sampler and the loaders."""
        from engine.data import build_dataset

        cfg = self.cfg
        dataset = build_dataset(cfg["dataset"], self.tokenizer)
        check_sequence_length(self.model, dataset)
        self.source_names = list(getattr(dataset, "source_names", None) or [])
        val = cfg["validation"]  # None, or the block with its defaults filled in by the schema
        self.val_loader = None
        self.val_every = None
        if val:
            self.val_every, self.val_max_batches = val["every_n_steps"], val["max_batches"]
            dataset, val_set = validation_split(val, dataset, self.tokenizer, self.model, self.seed)
            self.val_loader = self._loader(val_set, shuffle=False)
        self.train_set = dataset
        self.loader = self._loader(dataset, shuffle=bool(cfg["shuffle"]))
        self.sampler = self.loader.batch_sampler
        per_epoch = recipe_loop.steps_per_epoch(
            len(self.sampler), self.accum, self.max_steps_per_epoch, hint="lower it or the batch size"
        )
        self.steps_per_epoch = per_epoch
        self.total_steps = per_epoch * self.epochs

    def _loader(self, dataset: Dataset, *, shuffle: bool) -> DataLoader:
        sampler = EpochBatchSampler(
            len(dataset), batch_size=self.batch_size, world_size=self.dp_size, rank=self.dp_rank,
            seed=self.seed, shuffle=shuffle,
        )  # fmt: skip
        return DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=collate_for(dataset, pad_id=self.tokenizer.pad_id),
            num_workers=int(self.cfg["num_workers"]),
            # Its own generator: each new iterator draws a worker seed, which must not advance the
            # global RNG (dropout) differently in a resumed run than in an uninterrupted one.
            generator=torch.Generator().manual_seed(self.seed),
        )

    def _setup_loss(self) -> nn.Module:
        from engine.modules.loss import LinearCrossEntropyLoss

        node = self.cfg["loss"] or {"_component_": "engine.modules.loss.LinearCrossEntropyLoss"}
        self.linear_ce = str(node.get("_component_", "")).endswith("LinearCrossEntropyLoss")
        # Token-loss SUMS per micro-batch; the step divides by its token count (see module docstring).
        loss = instantiate(node, reduction="sum" if self.linear_ce else "none")
        self.linear_ce = isinstance(loss, LinearCrossEntropyLoss)
        return loss

    # ------------------------------------------------------------------------------------ training
    def _token_losses(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(sum of token losses [] fp32, per-token losses [B,S] detached or None)` of one micro-batch."""
        kwargs = {"position_ids": batch.get("position_ids"), "document_ids": batch.get("document_ids")}
        labels = batch["labels"]  # [B,S], already shifted
        want_per_token = len(self.source_names) > 1
        if self.loss_parallel:
            from engine.training import token_losses

            with self.offload:
                logits = self.model(batch["tokens"], **kwargs)  # [B,S,V] DTensor sharded on V
            per_token = token_losses(logits, labels)  # [B,S] fp32, 0 where ignored
            return per_token.sum(), per_token.detach()
        if self.linear_ce:
            model, loss_fn = self.model, self.loss_fn

            def hidden_then_loss(tokens, **kw):
                hidden = model.forward_hidden(tokens, **kw)  # [B,S,D]
                return loss_fn(hidden, model.output_weight, labels, return_per_token=want_per_token)

            with forward_replaced(model, hidden_then_loss), self.offload:
                out = model(batch["tokens"], **kwargs)
            return out if want_per_token else (out, None)
        with self.offload:
            logits = self.model(batch["tokens"], **kwargs)  # [B,S,V]
        per_token = self.loss_fn(logits, labels)  # [B,S] fp32, 0 where ignored
        return per_token.sum(), per_token.detach()

    def _to_device(self, batch: dict) -> dict[str, torch.Tensor]:
        """This rank's part of a batch, on its device: the cp rank's sequence slice (context parallel),
        padded to a multiple of tp (sequence parallel); tp ranks share it."""
        from engine.training.context_parallel import pad_batch, split_batch

        batch = {
            k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()
        }
        if self.dims.cp > 1:
            return split_batch(
                batch, self.dims.cp, self.cp_rank, pad_id=self.tokenizer.pad_id, multiple=self.tp
            )
        if self.tp > 1:
            return pad_batch(batch, self.tp, pad_id=self.tokenizer.pad_id)
        return batch

    def _scale_grads(self, factor: float) -> None:
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)

    def train(self) -> int:
        """Run to the end (0), to a SIGTERM (checkpoint, 0), or to a NaN loss (`LossIsNaN`)."""
        from engine.training import reset_peak_memory

        reset_peak_memory(self.device)
        log = self.logger
        log.set_progress(self.global_step, self.total_steps)
        self.model.train()
        n_sources = max(1, len(self.source_names))
        while self.epoch < self.epochs and self.global_step < self.total_steps:
            self.sampler.set_epoch(self.epoch, skip=self.batches_in_epoch)
            if hasattr(self.train_set, "set_epoch"):
                self.train_set.set_epoch(self.epoch)  # weighted mixes redraw their samples per epoch
            step_in_epoch = self.batches_in_epoch // self.accum
            # On the device, read once per step: [loss sum, loss tokens, tokens, (loss sum, tokens) per
            # source, MoE load-balancing loss x loss tokens]
            stats = torch.zeros(4 + 2 * n_sources, dtype=torch.float64, device=self.device)
            t0 = time.perf_counter()
            for batch in self.loader:
                if step_in_epoch >= self.steps_per_epoch:
                    break
                n_tokens = batch["tokens"].numel() / self.dims.cp  # before padding; cp ranks share them
                batch = self._to_device(batch)
                labels = batch["labels"]
                loss_tokens = (labels != -100).sum()
                if self.optimizer_in_bwd:
                    # The update happens inside backward, so the step's normaliser is needed first.
                    step_tokens = all_reduce_sum(loss_tokens.detach().double().clone()) / self.tp
                loss_sum, per_token = self._token_losses(batch)
                stats[0] += loss_sum.detach().double()  # the cross-entropy alone: `loss`
                aux = None
                if self.is_moe:  # padding (source id -1) left out, as transformers' attention_mask does
                    sources = batch.get("source_ids")
                    real = None if sources is None else sources >= 0
                    aux = weighted_aux_loss(self.model, mask=real, pooled=self.world_size > 1)
                if aux is not None:
                    # Weighted by this micro-batch's loss tokens: the step's gradient scaling then
                    # turns it into coef x aux (router figures pooled over ranks: see engine.modules.moe).
                    loss_sum = loss_sum + aux[0] * loss_tokens
                    stats[-1] += aux[1].double() * loss_tokens
                if self.optimizer_in_bwd:
                    (loss_sum * (self.grad_ranks / step_tokens.clamp(min=1).item())).backward()
                else:
                    loss_sum.backward()
                stats[1] += loss_tokens
                sources = batch.get("source_ids")
                stats[2] += (sources >= 0).sum() if sources is not None else n_tokens
                if per_token is not None and sources is not None:
                    for s in range(n_sources):
                        sel = (sources == s) & (labels != -100)
                        stats[3 + 2 * s] += per_token[sel].double().sum()
                        stats[4 + 2 * s] += sel.sum()
                self.batches_in_epoch += 1
                if self.batches_in_epoch % self.accum:
                    continue

                # ---- one optimizer step -------------------------------------------------------
                all_reduce_sum(stats)
                totals = (stats / self.tp).tolist()  # the step's one host sync; tp ranks counted once
                step_loss = totals[0] / max(totals[1], 1.0)
                recipe_loop.check_finite_loss(step_loss, self.global_step + 1)
                if not self.optimizer_in_bwd:
                    if self.ep > 1:  # several EP groups: sum expert gradients over them
                        from engine.training.expert_parallel import reduce_expert_grads

                        reduce_expert_grads(self.model)
                    self._scale_grads(self.grad_ranks / max(totals[1], 1.0))
                # optimizer_in_bwd: the updates ran in backward (no norm; its step() is a no-op)
                params = None if self.optimizer_in_bwd else self.model.parameters()
                lr, grad_norm = recipe_loop.optimizer_step(
                    params, self.optimizer, self.lr_scheduler, self.clip_grad_norm
                )
                self.global_step += 1
                step_in_epoch += 1
                elapsed = time.perf_counter() - t0
                self.tokens_total += int(totals[2])
                metrics = {
                    "loss": step_loss,
                    "lr": lr,
                    "tokens_per_sec": totals[2] / max(elapsed, 1e-9),
                    "tokens_total": self.tokens_total,
                    "epoch": self.epoch,
                }
                if grad_norm is not None:
                    metrics["grad_norm"] = grad_norm
                if self.is_moe:
                    metrics["loss/aux"] = totals[-1] / max(totals[1], 1.0)
                if n_sources > 1:
                    for s, name in enumerate(self.source_names):
                        if totals[4 + 2 * s] > 0:
                            metrics[f"loss/{name}"] = totals[3 + 2 * s] / totals[4 + 2 * s]
                recipe_loop.log_step(self, metrics)
                self.loss_history.append(step_loss)
                stats.zero_()

                if self.val_every and self.global_step % self.val_every == 0:
                    self.validate()
                if step_in_epoch >= self.steps_per_epoch:
                    break  # the epoch-end checkpoint below covers this step
                if recipe_loop.save_or_stop(self):
                    return 0
                t0 = time.perf_counter()
            if recipe_loop.end_epoch(self):
                return 0
        if self.cfg["save_merged_model"] and self.is_lora:
            self._save_merged()
        return 0

    @torch.no_grad()
    def validate(self) -> float:
        """Mean token loss over the held-out split (or its first `max_batches`), logged as `val_loss`."""
        self.model.eval()
        totals = torch.zeros(2, dtype=torch.float64, device=self.device)
        self.val_loader.batch_sampler.set_epoch(0)
        for i, batch in enumerate(self.val_loader):
            if self.val_max_batches is not None and i >= int(self.val_max_batches):
                break
            batch = self._to_device(batch)
            loss_sum, _ = self._token_losses(batch)
            totals[0] += loss_sum.double()
            totals[1] += (batch["labels"] != -100).sum()
        all_reduce_sum(totals)
        totals /= self.tp
        self.model.train()
        val = (totals[0] / totals[1].clamp(min=1)).item()
        if self.rank == 0:
            self.logger.log(self.global_step, {"val_loss": val})
        return val

    # --------------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        """`output_dir/checkpoints/step_<N>/`: the model (adapters or an HF folder), optimizer, recipe state."""
        return save_training_checkpoint(self, "tokens_total")

    def _save_merged(self) -> None:
        """`output_dir/merged/`: adapters folded into the base, a Hugging Face folder."""
        write_merged_model(self.model, self.cfg["model"], self.output_dir / "merged", model_dir=self.model_dir,
                           dtype=self.dtype)  # fmt: skip

    def cleanup(self) -> None:
        recipe_loop.close_logger(self.logger)


# the config check before anything is built, and `--config FILE [overrides]` (exit codes 0/1/2)
check_config, recipe_main = recipe_entry("sft", SFTRecipe)


if __name__ == "__main__":
    recipe_main()
