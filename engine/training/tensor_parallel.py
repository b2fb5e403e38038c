"""Tensor parallelism with sequence and loss parallelism, for plain, LoRA and QLoRA decoders.

Per block (Megatron layout): q/k/v and gate/up are column-parallel (each rank owns whole heads /
hidden units), output_proj and down_proj row-parallel. With sequence parallelism the residual
stream between the projections is sharded on the sequence dimension: every rank holds `[B, S/tp, D]`,
the norms run on their slice, the column-parallel inputs are all-gathered on the sequence and the
row-parallel outputs reduce-scattered onto it (the same traffic as plain TP's all-reduce, and 1/tp of
the activation memory between blocks).

Embeddings and output (`S % tp == 0` is required under sequence parallelism):
- untied output: the embedding is row-parallel on the vocabulary (a reduce-scatter onto the sequence),
  the output projection column-parallel on the vocabulary with loss parallelism: logits stay a
  `[B, S, V]` DTensor sharded on V (each rank holds `[B, S, V/tp]`) and `token_losses` computes the
  cross-entropy from the local shards (max, sum-exp and the target logit all-reduced; the backward
  needs no communication). This replaces linear / chunked cross-entropy under TP: the [B,S,V] tensor
  is never gathered, its per-rank size is 1/tp.
- tied output (`output=None`): embedding and output share one replicated weight; the final norm runs on
  the gathered sequence and the logits are computed whole on every rank, so the configured loss
  (linear cross-entropy included) runs as on one rank.

LoRA: an adapted projection shards its base weight like the plain linear and its adapters as the base
requires: column-parallel `lora_b [out, r]` on out (`lora_a` replicated), row-parallel `lora_a [r, in]`
on in (`lora_b` replicated; its input is a partial sum, which DTensor keeps partial until the output
reduction). QLoRA: torchao's NF4Tensor has no DTensor sharding rules for a TP split (it implements the
dim-0 chunking FSDP2 needs, not a sharded `linear`), so an NF4 projection keeps its whole base and
adapters replicated on every tp rank and computes its full output, of which each rank keeps its share
(the input all-gathered for a row-parallel one); gradients of the replicated adapters are identical
on every tp rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from engine.config import ConfigError
from engine.modules.peft.lora import LoRALinear, is_nf4

# Block submodule -> TP style. Column-parallel projections split their output features (whole heads /
# hidden units per rank); row-parallel ones split their input features and reduce the output.
TP_PLAN = {
    "attn.q_proj": "colwise",
    "attn.k_proj": "colwise",
    "attn.v_proj": "colwise",
    "attn.output_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}


# ---- LoRA projections --------------------------------------------------------------------------
def _lora_partition(style: str):
    """Placements of a LoRALinear's parameters for a column- or row-parallel split."""
    if style == "colwise":
        placements = {"weight": Shard(0), "bias": Shard(0), "lora_a.weight": Replicate(),
                      "lora_b.weight": Shard(0), "magnitude": Shard(0)}  # fmt: skip
    else:
        placements = {"weight": Shard(1), "bias": Replicate(), "lora_a.weight": Shard(1),
                      "lora_b.weight": Replicate(), "magnitude": Replicate()}  # fmt: skip

    def partition(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for local, param in list(module.named_parameters(recurse=False)):
            full = f"{name.rsplit('.', 1)[-1]}.{local}" if name.endswith(("lora_a", "lora_b")) else local
            placement = placements[full]
            dt = distribute_tensor(param, mesh, [placement])
            module.register_parameter(local, nn.Parameter(dt, requires_grad=param.requires_grad))

    return partition


def _to_dtensor(x: torch.Tensor, mesh: DeviceMesh, given, wanted) -> DTensor:
    if not isinstance(x, DTensor):
        x = DTensor.from_local(x, mesh, [given], run_check=False)
    return x.redistribute(placements=[wanted]) if x.placements != (wanted,) else x


def _shard_lora(
    module: LoRALinear, mesh: DeviceMesh, style: str, input_layout, output_layout, local_out: bool
):
    """Split a LoRALinear (plain base) over `mesh`; DTensor carries the adapter math."""
    wanted_in = Replicate() if style == "colwise" else Shard(-1)

    def input_fn(_mod, inputs, mesh_):
        return (_to_dtensor(inputs[0], mesh_, input_layout, wanted_in), *inputs[1:])

    def output_fn(_mod, out, mesh_):
        out = out.redistribute(placements=[output_layout]) if out.placements != (output_layout,) else out
        return out.to_local() if local_out else out

    distribute_module(module, mesh, _lora_partition(style), input_fn, output_fn)


def _replicate_lora(
    module: LoRALinear, mesh: DeviceMesh, style: str, input_layout, output_layout, local_out: bool
):
    """Keep an NF4 LoRALinear whole on every tp rank; hand on this rank's share of its output."""

    def pre_hook(_mod, inputs):
        x = inputs[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, [input_layout], run_check=False)
        return (x.redistribute(placements=[Replicate()]).to_local(), *inputs[1:])

    def post_hook(_mod, _inputs, out):
        dt = DTensor.from_local(out, mesh, [Replicate()], run_check=False).redistribute(
            placements=[output_layout]
        )
        return dt.to_local() if local_out else dt

    module.register_forward_pre_hook(pre_hook)
    module.register_forward_hook(post_hook)


def _parallelize_lora(module: LoRALinear, mesh: DeviceMesh, style: str, *, input_layout=None,
                      output_layout=None, local_out: bool = True) -> None:  # fmt: skip
    if input_layout is None:
        input_layout = Replicate() if style == "colwise" else Shard(-1)
    if output_layout is None:
        output_layout = Shard(-1) if style == "colwise" else Replicate()
    if is_nf4(module.weight):
        _replicate_lora(module, mesh, style, input_layout, output_layout, local_out)
    else:
        _shard_lora(module, mesh, style, input_layout, output_layout, local_out)


# ---- the model ---------------------------------------------------------------------------------
def _check_block(block: nn.Module, i: int, tp: int) -> None:
    for name in TP_PLAN:
        try:
            sub = block.get_submodule(name)
        except AttributeError:
            raise ConfigError(
                f"block {i} has no `{name}` (TP expects attn.q_proj/k_proj/v_proj/"
                "output_proj and mlp.gate_proj/up_proj/down_proj)",
                hint="set tensor_parallel_dim=1",
                field="tensor_parallel_dim",
            ) from None
        if type(sub) not in (nn.Linear, LoRALinear):
            raise ConfigError(
                f"block {i} `{name}` is a {type(sub).__name__}; tensor parallelism "
                "splits nn.Linear and LoRALinear projections",
                hint="set tensor_parallel_dim=1",
                field="tensor_parallel_dim",
            )
    for heads in ("num_heads", "num_kv_heads"):
        if getattr(block.attn, heads) % tp:
            raise ConfigError(
                f"{tp} does not divide {heads}={getattr(block.attn, heads)}",
                hint="choose a divisor",
                field="tensor_parallel_dim",
            )


def _split(module: nn.Module, mesh: DeviceMesh, style: str, **layouts) -> None:
    """Column/row-parallel split of one projection, nn.Linear or LoRALinear, with the given layouts."""
    if isinstance(module, LoRALinear):
        _parallelize_lora(module, mesh, style, **layouts)
        return
    kwargs = {}
    if "input_layout" in layouts:
        kwargs["input_layouts"] = layouts["input_layout"]
    if "output_layout" in layouts:
        kwargs["output_layouts"] = layouts["output_layout"]
    if "local_out" in layouts:
        kwargs["use_local_output"] = layouts["local_out"]
    parallelize_module(
        module, mesh, ColwiseParallel(**kwargs) if style == "colwise" else RowwiseParallel(**kwargs)
    )


def _require_sequence_multiple(tp: int):
    def check(_mod, inputs):
        tokens = inputs[0]
        if tokens.shape[-1] % tp:
            raise ValueError(
                f"sequence parallelism: the sequence length {tokens.shape[-1]} must be a multiple of "
                f"tensor_parallel_dim={tp} — pad the batch (the SFT recipe does)"
            )

    return check


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, *, sequence_parallel: bool = True) -> None:
    """Split `model` (a TransformerDecoder, possibly with LoRA/NF4 projections) over `tp_mesh`, in place.

    After this call the attention modules hold their local head counts, an untied model returns
    vocab-sharded DTensor logits (use `token_losses`), a tied one plain full logits.

    Raises:
        ConfigError: a block TP cannot split, head counts or vocabulary not divisible by tp.
    """
    tp = tp_mesh.size()
    requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
    layers = model.layers
    for i, block in enumerate(layers):
        _check_block(block, i, tp)
    tied = getattr(model, "output", None) is None
    vocab = model.tok_embeddings.num_embeddings
    if not tied and vocab % tp:
        raise ConfigError(
            f"{tp} does not divide the vocabulary ({vocab})",
            hint="choose a divisor",
            field="tensor_parallel_dim",
        )
    seq = Shard(1)
    # Residual stream layout between blocks: sequence-sharded local tensors (SP) or full ones.
    stream = seq if sequence_parallel else Replicate()
    for block in layers:
        if sequence_parallel:
            parallelize_module(
                block,
                tp_mesh,
                {
                    "sa_norm": SequenceParallel(),
                    "attn": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
                    "mlp_norm": SequenceParallel(),
                    "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
                },
            )
        for name, style in TP_PLAN.items():
            if style == "colwise":
                _split(block.get_submodule(name), tp_mesh, "colwise")
            else:
                _split(block.get_submodule(name), tp_mesh, "rowwise", output_layout=stream)
        # Each rank now computes its own heads: the attention reshapes use local head counts.
        block.attn.num_heads //= tp
        block.attn.num_kv_heads //= tp

    if sequence_parallel:
        model.tok_embeddings.register_forward_pre_hook(_require_sequence_multiple(tp))
    if tied:
        if sequence_parallel:
            # Replicated embedding: its full output is sliced onto the sequence (no communication);
            # the final norm runs on the gathered sequence so the tied projection sees plain tensors.
            parallelize_module(
                model,
                tp_mesh,
                {
                    "tok_embeddings": PrepareModuleOutput(
                        output_layouts=Replicate(), desired_output_layouts=seq, use_local_output=True
                    ),
                    "norm": PrepareModuleInput(
                        input_layouts=(seq,), desired_input_layouts=(Replicate(),), use_local_output=True
                    ),
                },
            )
    else:
        parallelize_module(
            model.tok_embeddings, tp_mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
        )
        if sequence_parallel:
            parallelize_module(model.norm, tp_mesh, SequenceParallel())
        # Loss parallel: vocab-sharded logits, never gathered.
        _split(
            model.output, tp_mesh, "colwise", input_layout=stream, output_layout=Shard(-1), local_out=False
        )
    for name, p in model.named_parameters():  # torch's styles make every split parameter trainable
        p.requires_grad_(requires_grad.get(name, p.requires_grad))


# ---- loss parallel -----------------------------------------------------------------------------
class _VocabParallelCE(torch.autograd.Function):
    """Per-token cross-entropy from vocab-sharded logits `[N, V/tp]`; labels `[N]` global ids."""

    @staticmethod
    def forward(ctx, logits, labels, vocab_start, group, ignore_index):
        x = logits.float()  # [N, V_local]
        m = x.max(dim=-1).values  # [N]
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        e = (x - m[:, None]).exp_()
        sum_exp = e.sum(dim=-1)
        dist.all_reduce(sum_exp, group=group)
        local = labels - vocab_start
        here = (local >= 0) & (local < x.shape[-1]) & (labels != ignore_index)
        idx = local.clamp(0, x.shape[-1] - 1)
        target = torch.where(here, x.gather(-1, idx[:, None]).squeeze(-1), torch.zeros_like(m))
        dist.all_reduce(target, group=group)
        valid = labels != ignore_index
        loss = torch.where(valid, sum_exp.log() + m - target, torch.zeros_like(m))
        probs = e.div_(sum_exp[:, None])  # softmax shard [N, V_local]
        ctx.save_for_backward(probs, idx, here, valid)
        ctx.logits_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx, grad):
        probs, idx, here, valid = ctx.saved_tensors
        g = probs
        g.scatter_add_(-1, idx[:, None], -here.to(g.dtype)[:, None])
        g.mul_((grad * valid.to(grad.dtype))[:, None])
        return g.to(ctx.logits_dtype), None, None, None, None


def token_losses(logits: torch.Tensor, labels: torch.Tensor, *, ignore_index: int = -100) -> torch.Tensor:
    """Per-token cross-entropy `[B,S]` fp32 (0 where ignored) from logits `[B,S,V]`.

    A DTensor sharded on the vocabulary (loss parallel) is reduced from its local shards; a plain or
    replicated tensor goes through `F.cross_entropy`.
    """
    b, s = labels.shape
    if isinstance(logits, DTensor):
        if logits.placements != (Shard(logits.ndim - 1),) and logits.placements != (Shard(-1),):
            logits = logits.full_tensor()
        else:
            mesh = logits.device_mesh
            local = logits.to_local()  # [B,S,V/tp]
            v_local = local.shape[-1]
            start = mesh.get_local_rank() * v_local
            out = _VocabParallelCE.apply(
                local.reshape(b * s, v_local), labels.reshape(-1), start, mesh.get_group(), ignore_index
            )
            return out.view(b, s)
    flat = torch.nn.functional.cross_entropy(
        logits.float().reshape(b * s, -1), labels.reshape(-1), ignore_index=ignore_index, reduction="none"
    )
    return flat.view(b, s)
