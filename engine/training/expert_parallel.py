"""Expert parallelism: each rank holds `E / ep` experts of every MoE layer; tokens travel to the rank
of their expert and back with `all_to_all` (uneven splits; autograd-aware, gloo and NCCL).

Which ranks: EP borrows the data-parallel shard ranks. With the mesh `(dp_replicate, dp_shard, cp,
tp)` and `tp = 1`, `ep` must divide `dp_shard`; EP groups are blocks of `ep` consecutive ranks
(`world / ep` groups, each holding all experts once). A 2-D mesh `("ep_replicate", "ep")` names
them: expert weights are DTensors `Shard(0)` on the `ep` dimension, left out of FSDP2 (which shards
the rest over dp_shard), so the optimizer, gradient clipping and full state dicts see them as sharded
tensors. Every token is computed: nothing is dropped for capacity.

With activation checkpointing the block's forward, exchanges included, is recomputed in backward on
every rank alike (same blocks, same order), so the collectives stay matched; with `compile` the
exchange and the experts run eagerly between the block's compiled graphs (`MoE._experts_forward`).

Gradients: an expert's gradient sums the token-loss sums of its whole EP group; FSDP2 averages the
other gradients over the `dp` ranks, so expert gradients are scaled by `1 / dp` in backward, and
with several EP groups `reduce_expert_grads` sums them over the groups before the optimizer step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from engine.config import ConfigError, ConfigProblem
from engine.modules.moe import GroupedExperts, moe_layers, permute_rows

CONFIG_KEY = "expert_parallel_dim"


# ---- checks (no process group: the launcher runs them before any process starts) ----------------
def expert_parallel_problems(cfg: dict, world_size: int) -> list[ConfigProblem]:
    """Problems with `expert_parallel_dim` for `world_size` ranks (empty when it fits).

    Builds the model on `meta` (no memory) to count its experts.
    """
    ep = cfg.get(CONFIG_KEY, 1)
    ep = 1 if ep is None else ep
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        return [ConfigProblem(CONFIG_KEY, f"must be a positive integer, got {ep!r}", "set it to 1 or more")]
    if ep == 1:
        return []
    if world_size % ep:
        return [
            ConfigProblem(
                CONFIG_KEY,
                f"{ep} does not divide the {world_size} ranks",
                "choose a divisor of the number of processes",
            )
        ]
    from engine.training.device_mesh import check_parallel_degrees, parallel_dims

    if check_parallel_degrees(cfg, world_size):
        return []  # the degrees' own problem is reported by their check
    dims = parallel_dims(cfg, world_size)
    if dims.tp > 1 or dims.cp > 1:
        return [
            ConfigProblem(
                CONFIG_KEY,
                "expert parallelism with tensor or context parallelism is not supported",
                "set tensor_parallel_dim=1 and context_parallel_dim=1, or expert_parallel_dim=1",
            )
        ]
    if dims.dp_shard % ep:
        return [
            ConfigProblem(
                CONFIG_KEY,
                f"{ep} does not divide data_parallel_shard_dim={dims.dp_shard} (EP borrows the shard ranks)",
                "choose a divisor of the shard degree",
            )
        ]
    if cfg.get("optimizer_in_bwd") and dims.dp > ep:
        return [
            ConfigProblem(
                CONFIG_KEY,
                f"with {dims.dp // ep} expert-parallel groups, expert gradients are summed after backward",
                "set optimizer_in_bwd=false, or expert_parallel_dim to the data-parallel degree",
            )
        ]
    experts = _num_experts(cfg)
    if experts is None:
        return [
            ConfigProblem(
                CONFIG_KEY,
                "the model is dense (no mixture-of-experts layers)",
                "set expert_parallel_dim=1, or pick a Qwen3-MoE / Mixtral model",
            )
        ]
    if experts % ep:
        return [
            ConfigProblem(
                CONFIG_KEY,
                f"{ep} does not divide the model's {experts} experts",
                "choose a divisor of the number of experts",
            )
        ]
    return []


def _num_experts(cfg: dict) -> int | None:
    from engine.config import instantiate

    node = cfg.get("model")
    if not isinstance(node, dict):
        return None
    try:
        with torch.device("meta"):
            model = instantiate(node)
    except ConfigError:
        return None  # the model node's own problem is reported by validation
    layers = moe_layers(model)
    return layers[0].num_experts if layers else None


def check_expert_parallel(cfg: dict, world_size: int) -> int:
    """The expert-parallel degree of `cfg`. Raises ConfigError: the first problem."""
    problems = expert_parallel_problems(cfg, world_size)
    if problems:
        raise ConfigError.from_problem(problems[0])
    return int(cfg.get(CONFIG_KEY) or 1)


# ---- the all_to_all -----------------------------------------------------------------------------
class _AllToAll(torch.autograd.Function):
    """`all_to_all_single` with split sizes; backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x, out_splits: list[int], in_splits: list[int], group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """Rows `x[in_splits[j]]` go to rank j of `group`; returns the rows received (`out_splits`)."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


class ExpertDispatcher:
    """Runs a layer's sorted `(token, expert)` rows through experts spread over an EP group.

    `__call__(experts, routed [N,D] sorted by global expert, counts [E]) -> [N,D]` in the same order.
    """

    def __init__(self, group, ep: int, local_experts: int) -> None:
        self.group, self.ep, self.local = group, ep, local_experts

    def __call__(self, experts: GroupedExperts, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        ep, local = self.ep, self.local
        # How many rows each rank sends to each of the destination's experts: [ep, local]
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts.contiguous(), group=self.group)
        send = counts.view(ep, local).sum(1).tolist()
        recv_by_source = recv_counts.view(ep, local)  # [source rank, local expert]
        recv = recv_by_source.sum(1).tolist()
        received = all_to_all(routed, recv, send, self.group)  # by source rank, then local expert
        # Regroup by local expert (stable over source ranks), run, and restore the received order.
        expert_of_row = torch.repeat_interleave(
            torch.arange(local, device=routed.device).repeat(ep), recv_by_source.reshape(-1)
        )
        order = torch.argsort(expert_of_row, stable=True)
        inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
        out = experts(permute_rows(received, order, inverse), recv_by_source.sum(0))
        restored = permute_rows(out, inverse, order)
        return all_to_all(restored, send, recv, self.group)


# ---- applying it --------------------------------------------------------------------------------
def expert_mesh(world_size: int, ep: int, device_type: str) -> DeviceMesh:
    """The 2-D mesh `("ep_replicate", "ep")`: rows of `ep` consecutive ranks (a collective)."""
    ranks = torch.arange(world_size).view(world_size // ep, ep)
    return DeviceMesh(device_type, ranks, mesh_dim_names=("ep_replicate", "ep"))


def expert_params(model: nn.Module) -> list[nn.Parameter]:
    """Every parameter held by `GroupedExperts` modules, in module order (the same on every rank;
    FSDP2 leaves these alone under EP)."""
    return [p for m in model.modules() if isinstance(m, GroupedExperts) for p in m.parameters()]


def apply_expert_parallel(model: nn.Module, mesh: DeviceMesh, *, dp_size: int) -> None:
    """Shard every MoE layer's experts over `mesh["ep"]` and route tokens with all_to_all, in place.

    Works on a `meta` model (before materialising) or a real one. `dp_size`: the data-parallel
    degree FSDP2 averages gradients over (expert gradients are scaled to match).

    Raises ConfigError: a dense model, or an expert count the EP degree does not divide.
    """
    ep_mesh = mesh["ep"]
    ep = ep_mesh.size()
    layers = moe_layers(model)
    if not layers:
        raise ConfigError("the model has no experts", hint=f"set {CONFIG_KEY}=1", field=CONFIG_KEY)
    for moe in layers:
        experts = moe.experts
        if experts.num_experts % ep:
            raise ConfigError(
                f"{ep} does not divide {experts.num_experts} experts",
                hint="choose a divisor",
                field=CONFIG_KEY,
            )
        for name, param in list(experts.named_parameters(recurse=False)):
            sharded = distribute_tensor(param.detach(), ep_mesh, [Shard(0)]) if not param.is_meta else None
            if sharded is None:  # meta: the DTensor's local shape only
                local = torch.empty(
                    (param.shape[0] // ep, *param.shape[1:]), device="meta", dtype=param.dtype
                )
                sharded = DTensor.from_local(local, ep_mesh, [Shard(0)], run_check=False)
            setattr(experts, name, nn.Parameter(sharded, requires_grad=param.requires_grad))
        experts.grad_scale = 1.0 / dp_size
        moe.dispatcher = ExpertDispatcher(ep_mesh.get_group(), ep, experts.num_experts // ep)
    model.expert_mesh = mesh


def reduce_expert_grads(model: nn.Module) -> None:
    """Sum expert gradients over the EP groups (a no-op with one group); call before the step.

    One all_reduce per expert parameter, in module order on every rank: the collectives pair up by
    their order, and a layer's `gate_proj`/`up_proj`/`down_proj` have the same number of elements, so
    any other order (a set's, which follows memory addresses) would silently sum one rank's
    `up_proj` gradient into another rank's `gate_proj`.
    """
    mesh = getattr(model, "expert_mesh", None)
    if mesh is None or mesh["ep_replicate"].size() == 1:
        return
    group = mesh["ep_replicate"].get_group()
    for p in expert_params(model):
        if p.grad is not None:
            local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(local, group=group)
