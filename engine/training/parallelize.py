"""`parallelize`: tensor parallelism -> activation checkpointing -> compile -> FSDP2, in that order.

The order matters: TP rewrites projection weights into DTensors sharded on the "tp" mesh dimension,
checkpointing then wraps whole blocks, compile traces each wrapped block once, and FSDP2 shards what
results on the "dp" dimension (per block, then the root for embeddings, final norm and output).
Build the model on `meta`, call `parallelize`, then `materialize_model` to allocate only the local
shards and fill them from a full state dict (or an init function).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor

from engine.config import ConfigError
from engine.training.activation_checkpointing import _layers, apply_activation_checkpointing
from engine.training.context_parallel import ContextParallel
from engine.training.device_mesh import ParallelDims, fsdp_mesh, mesh_dims
from engine.training.tensor_parallel import apply_tensor_parallel


def parallelize(
    model: nn.Module,
    *,
    mesh: DeviceMesh | None,
    sequence_parallel: bool = True,
    activation_checkpointing: bool | int = False,
    compile: bool = False,
    fsdp: bool = True,
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    expert_mesh: DeviceMesh | None = None,
) -> nn.Module:
    """Apply the parallelism and memory options to a decoder, in place; returns the model.

    Args:
        model: has `layers: nn.ModuleList` (on `meta` or a real device).
        mesh: from `build_world_mesh` (dims `MESH_DIMS`: dp_replicate, dp_shard, cp, tp); None for
            one process, no FSDP/TP. The degrees are read from it.
        sequence_parallel: under TP, shard norms and the residual stream on the sequence (see
            `engine.training.tensor_parallel`; the sequence length must then be a multiple of tp).
        activation_checkpointing: False, True (every block) or k (every k-th block).
        compile: `torch.compile` each block (the loss and the root run eagerly).
        fsdp: shard parameters, gradients and optimizer state with FSDP2 over dp_shard (x cp),
            replicated over dp_replicate (HSDP when that is > 1). NF4 (QLoRA) bases must be real
            tensors (not `meta`): those that split evenly are sharded, the others kept whole.
        reshard_after_forward: free the gathered block weights after forward (re-gather in backward):
            less memory, one more all-gather per block.
        cpu_offload: keep sharded parameters/gradients/optimizer state in CPU memory (FSDP2).
        param_dtype, reduce_dtype: FSDP2 mixed precision (e.g. bf16 compute, fp32 gradient reduce).
        expert_mesh: expert parallelism (MoE), from `engine.training.expert_parallel.expert_mesh`:
            experts sharded over its "ep" dimension and left out of FSDP2 (applied after TP).

    Raises:
        ConfigError: a mesh/option mismatch, TP on an unsupported block.
    """
    if fsdp and mesh is None:
        raise ConfigError(
            "fsdp/tensor parallelism need a device mesh",
            hint="launch with torchrun or set fsdp=false",
            label="parallelize",
            field="fsdp",
        )
    if cpu_offload and fsdp and mesh.device_type == "cpu":
        raise ConfigError(
            "the parameters already live in CPU memory on a CPU run",
            hint="set fsdp_cpu_offload=false",
            field="fsdp_cpu_offload",
        )
    dims = mesh_dims(mesh) if mesh is not None else ParallelDims()
    layers = _layers(model)

    # 1. Tensor parallelism (+ sequence and loss parallelism; plain, LoRA and NF4 projections).
    if dims.tp > 1:
        apply_tensor_parallel(model, mesh["tp"], sequence_parallel=sequence_parallel)

    # 1b. Expert parallelism: experts sharded over "ep", tokens dispatched with all_to_all; expert
    # gradients scaled to FSDP2's average over the dp x cp ranks.
    ignored = None
    if expert_mesh is not None:
        from engine.training.expert_parallel import apply_expert_parallel, expert_params

        apply_expert_parallel(model, expert_mesh, dp_size=dims.dp * dims.cp)
        ignored = set(expert_params(model))

    # 2. Context parallelism: each rank attends over its sequence slice through the cp ring.
    if dims.cp > 1:
        model.context_parallel = ContextParallel(mesh["cp"].get_group())

    # 3. Activation checkpointing per block.
    if activation_checkpointing:
        every_k = 1 if activation_checkpointing is True else int(activation_checkpointing)
        apply_activation_checkpointing(model, every_k=every_k)

    # 4. Compile per block: repeated identical blocks share one compiled graph.
    if compile:
        for block in layers:
            block.compile()

    # 5. FSDP2: each block its own unit (gathered just in time), then the root for the rest.
    if fsdp:
        shard_mesh = fsdp_mesh(mesh)
        whole = _unshardable_nf4(model, shard_mesh.size(shard_mesh.ndim - 1))
        if whole:
            ignored = (ignored or set()) | whole
        kwargs = {"mesh": shard_mesh, "ignored_params": ignored}
        if param_dtype is not None or reduce_dtype is not None:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        if cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy()
        for i, block in enumerate(layers):
            # The last block's weights are needed again at once by backward: keep them gathered.
            last = i == len(layers) - 1
            fully_shard(block, reshard_after_forward=reshard_after_forward and not last, **kwargs)
        # Root: None lets FSDP2 keep it gathered after forward (backward needs it at once).
        fully_shard(model, reshard_after_forward=None if reshard_after_forward else False, **kwargs)
        if callable(getattr(model, "forward_hidden", None)):
            # Linear cross-entropy calls forward_hidden, not forward: it must gather the root's weights
            # too. The root is never resharded after forward, so `model.output_weight` read right after
            # it is the gathered [V, D] weight, and its gradient flows back through FSDP.
            register_fsdp_forward_method(model, "forward_hidden")
    return model


def _unshardable_nf4(model: nn.Module, shards: int) -> set[nn.Parameter]:
    """QLoRA under FSDP2: the NF4 bases that cannot be split into `shards` equal chunks (whole blocks
    and scaler groups each, `nf4_shardable`). They are frozen, so FSDP2 can leave them out: every rank
    keeps them whole, as under tensor parallelism; the other NF4 bases are sharded like any weight
    (torchao's NF4Tensor all-gathers its packed form, `fsdp_pre/post_all_gather`)."""
    from engine.modules.peft.lora import is_nf4, nf4_shardable

    return {p for p in model.parameters() if is_nf4(p) and not nf4_shardable(p, shards)}


def materialize_model(
    model: nn.Module,
    *,
    device: torch.device | str,
    state_dict: dict[str, torch.Tensor] | None = None,
    init_fn: Callable[[nn.Module], None] | None = None,
    broadcast_from_rank0: bool = False,
    strict: bool = True,
) -> nn.Module:
    """Allocate a (possibly sharded) `meta` model on `device` and fill it.

    Args:
        state_dict: a FULL (unsharded) state dict; each rank keeps its own shards of it.
        init_fn: called with the model under `no_grad` when no state dict is given (random init).
        broadcast_from_rank0: only rank 0 holds `state_dict` (others pass `{}`); it is broadcast.
        strict: refuse missing/unexpected keys.

    Raises:
        ConfigError: neither a state dict nor an init function, or keys that do not match.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if state_dict is None and init_fn is None:
        raise ConfigError("materializing needs a checkpoint or an init function", field="model")
    if (
        state_dict is not None and strict and (state_dict or not broadcast_from_rank0)
    ):  # ranks > 0 may pass {} when broadcasting
        expected = set(model.state_dict())
        missing, unexpected = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
        if missing or unexpected:
            raise ConfigError(
                f"weights do not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})",
                hint="check the model builder and checkpoint",
                field="checkpoint",
            )
    device = torch.device(device)
    model.to_empty(device=device)
    for module in model.modules():  # non-persistent buffers (RoPE tables) are not in checkpoints
        rope_init = getattr(module, "rope_init", None)
        if callable(rope_init):
            rope_init(device)
    if state_dict is None:
        with torch.no_grad():
            init_fn(model)
        return model
    options = StateDictOptions(full_state_dict=True, strict=strict, broadcast_from_rank0=broadcast_from_rank0)
    try:
        set_model_state_dict(model, state_dict, options=options)
    except (RuntimeError, KeyError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"weights do not match the model ({first})",
            hint="check the model builder and checkpoint",
            field="checkpoint",
        ) from None
    return model


def clip_grad_norm(parameters: Iterable[nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """Total gradient 2-norm over all ranks (DTensor grads included); clips when `max_norm` is set.

    Gradients are grouped by kind (plain tensors, and DTensors per device mesh) so FSDP-sharded,
    TP-sharded and replicated gradients can be mixed; each group's norm is reduced to its full value.

    Returns:
        The norm before clipping, a plain fp32 scalar tensor (for the `grad_norm` metric).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    groups: dict[object, list[torch.Tensor]] = {}
    for g in grads:
        key = (id(g.device_mesh), tuple(g.placements)) if isinstance(g, DTensor) else "plain"
        groups.setdefault(key, []).append(g)
    squares = torch.zeros((), dtype=torch.float32)
    for group in groups.values():
        norm = torch.nn.utils.get_total_norm(group, norm_type=2.0, error_if_nonfinite=False, foreach=True)
        if isinstance(norm, DTensor):  # partial norms of the shards: reduce to the full norm
            norm = norm.full_tensor()
        squares = squares + norm.detach().float().cpu() ** 2
    total = squares.sqrt()
    if max_norm is not None:
        coef = float(max_norm) / (float(total) + 1e-6)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return total
