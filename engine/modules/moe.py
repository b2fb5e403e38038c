"""Mixture-of-experts feed-forward: a top-k router and stacked SwiGLU experts run as one grouped GEMM.

Every routed token is computed (no capacity, nothing dropped): the `T*k` (token, expert) pairs are
sorted by expert once, each expert multiplies its contiguous slice, and the weighted outputs are
added back to their tokens. On CUDA the slices run as one `torch.nn.functional.grouped_mm` (or the
older `torch._grouped_mm`), probed once per device/dtype against the loop; elsewhere, and for shapes
the kernel refuses, an exact per-expert loop over the same sorted slices.

Router orders (both as in transformers): Qwen3-MoE takes softmax over all experts, the top-k, and
renormalises the k weights only when `norm_topk_prob`; Mixtral always renormalises (equal to its
original top-k-of-logits then softmax).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

EXPERT_PROJS: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class MoESettings:
    """What makes a decoder's MLPs mixtures of experts (see `MoE`).

    `naming` picks the Hugging Face key spelling (`qwen3_moe`: `mlp.experts.{e}.gate_proj`,
    `mixtral`: `block_sparse_moe.experts.{e}.w1`); `router_aux_loss_coef` and `router_z_loss_coef`
    weigh the auxiliary losses a recipe adds to its loss (`moe_aux_loss`).
    """

    num_experts: int
    top_k: int
    moe_intermediate_dim: int
    norm_topk_prob: bool = True
    router_aux_loss_coef: float = 0.001
    router_z_loss_coef: float = 0.0
    naming: str = "qwen3_moe"

    def __post_init__(self) -> None:
        for field in ("num_experts", "top_k", "moe_intermediate_dim"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field}: must be a positive integer, got {value!r}")
        if self.top_k > self.num_experts:
            raise ValueError(
                f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts}); lower num_experts_per_tok"
            )
        for field in ("router_aux_loss_coef", "router_z_loss_coef"):
            if getattr(self, field) < 0:
                raise ValueError(f"{field}: must be >= 0, got {getattr(self, field)!r}")
        if self.naming not in ("qwen3_moe", "mixtral"):
            raise ValueError(f"naming: {self.naming!r} is not one of qwen3_moe, mixtral")


# ---- grouped GEMM ---------------------------------------------------------------------------------
def _grouped_mm_op():
    """The grouped GEMM torch offers (public name first, then the private one), or None."""
    return getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _offsets(counts_list: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(counts_list, device=device).cumsum(0).to(torch.int32)


def _loop_forward(x: torch.Tensor, w: torch.Tensor, counts_list: list[int]) -> torch.Tensor:
    # x: [N,in] sorted by group, w: [G,out,in] -> [N,out]: out[g rows] = x[g rows] @ w[g].T
    out = x.new_empty(x.shape[0], w.shape[1])
    start = 0
    for g, n in enumerate(counts_list):
        if n:
            torch.mm(x[start : start + n], w[g].t(), out=out[start : start + n])
        start += n
    return out


def _loop_input_grad(dy: torch.Tensor, w: torch.Tensor, counts_list: list[int]) -> torch.Tensor:
    # dy: [N,out], w: [G,out,in] -> dx [N,in]: dx[g rows] = dy[g rows] @ w[g]
    dx = dy.new_empty(dy.shape[0], w.shape[2])
    start = 0
    for g, n in enumerate(counts_list):
        if n:
            torch.mm(dy[start : start + n], w[g], out=dx[start : start + n])
        start += n
    return dx


def _loop_weight_grad(dy: torch.Tensor, x: torch.Tensor, counts_list: list[int]) -> torch.Tensor:
    # dy: [N,out], x: [N,in] -> dw [G,out,in]: dw[g] = dy[g rows].T @ x[g rows] (zero for no rows)
    dw = dy.new_empty(len(counts_list), dy.shape[1], x.shape[1])
    start = 0
    for g, n in enumerate(counts_list):
        if n:
            torch.mm(dy[start : start + n].t(), x[start : start + n], out=dw[g])
        else:
            dw[g].zero_()
        start += n
    return dw


def _op_forward(x, w, offs):
    return _grouped_mm_op()(x, w.transpose(-2, -1), offs=offs)


def _op_input_grad(dy, w, offs):
    return _grouped_mm_op()(dy, w, offs=offs)


def _op_weight_grad(dy, x, offs):
    return _grouped_mm_op()(dy.t(), x, offs=offs)  # groups split the shared (row) dimension


@functools.cache
def grouped_mm_works(device_type: str, dtype: torch.dtype) -> bool:
    """Whether torch's grouped GEMM computes the three products `grouped_mm` needs (the forward
    `x_g @ w_g.T`, the input gradient `dy_g @ w_g`, the weight gradient `dy_g.T @ x_g`, an empty
    group included) on `device_type`/`dtype` and equals the loop. Probed once, lazily: the op is
    private on older torch (`torch._grouped_mm`) and its CPU kernel is recent; without it, the loop."""
    if _grouped_mm_op() is None:
        return False
    try:
        g = torch.Generator(device=device_type).manual_seed(0)
        x = torch.randn(48, 32, device=device_type, dtype=dtype, generator=g)
        w = torch.randn(3, 16, 32, device=device_type, dtype=dtype, generator=g)
        dy = torch.randn(48, 16, device=device_type, dtype=dtype, generator=g)
        counts = [16, 0, 32]
        offs = _offsets(counts, x.device)
        with torch.no_grad():
            pairs = [
                (_op_forward(x, w, offs), _loop_forward(x, w, counts)),
                (_op_input_grad(dy, w, offs), _loop_input_grad(dy, w, counts)),
                (_op_weight_grad(dy, x, offs), _loop_weight_grad(dy, x, counts)),
            ]
        return all(
            got.shape == want.shape and bool(torch.allclose(got.float(), want.float(), atol=0.1, rtol=0.05))
            for got, want in pairs
        )
    except (RuntimeError, TypeError, ValueError, NotImplementedError):
        return False


def _use_op(x: torch.Tensor, w: torch.Tensor) -> bool:
    if x.dtype != w.dtype or x.shape[0] == 0:
        return False
    if x.device.type != "cpu" and (w.shape[-1] % 8 or w.shape[-2] % 8):
        return False  # the CUDA kernel wants 16-byte aligned rows
    return grouped_mm_works(x.device.type, x.dtype)


class _GroupedMM(torch.autograd.Function):
    """`y = cat_g(x_g @ w[g].T)` with its own backward: `dx_g = dy_g @ w[g]`, `dw[g] = dy_g.T @ x_g`
    (zero for an expert with no rows). All three are grouped GEMMs over the same offsets, run by
    torch's op when it works here (`grouped_mm_works`) or by a loop writing into one output tensor:
    no per-expert slices of `w` in the autograd graph (each would cost a zero-filled `[G,out,in]`
    gradient in backward) and no concatenation."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, counts_list: list[int]) -> torch.Tensor:
        use_op = _use_op(x, w)
        offs = _offsets(counts_list, x.device) if use_op else None
        ctx.save_for_backward(x, w)
        ctx.counts_list, ctx.offs = counts_list, offs
        return _op_forward(x, w, offs) if use_op else _loop_forward(x, w, counts_list)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w = ctx.saved_tensors
        dy = dy.contiguous()  # an expanded gradient (stride 0) is refused by the kernels
        offs, counts_list = ctx.offs, ctx.counts_list
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = _op_input_grad(dy, w, offs) if offs is not None else _loop_input_grad(dy, w, counts_list)
        if ctx.needs_input_grad[1]:
            dw = _op_weight_grad(dy, x, offs) if offs is not None else _loop_weight_grad(dy, x, counts_list)
        return dx, dw, None


def grouped_mm(x: torch.Tensor, w: torch.Tensor, counts_list: list[int]) -> torch.Tensor:
    """`cat_g(x_g @ w[g].T)` for `x` `[N,in]` sorted into groups of `counts_list` rows, `w` `[G,out,in]`."""
    return _GroupedMM.apply(x, w, counts_list)


def loop_mm(x: torch.Tensor, w: torch.Tensor, counts_list: list[int]) -> torch.Tensor:
    """The reference `grouped_mm`: one autograd-tracked matmul per group (tests compare against it)."""
    parts = torch.split(x, counts_list)
    return torch.cat([part @ w[g].transpose(0, 1) for g, part in enumerate(parts)])


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times `scale` backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


# ---- routing permutations -------------------------------------------------------------------------
class _Permute(torch.autograd.Function):
    """`x[index]` for a permutation `index` whose inverse is `inverse`: the gradient is gathered back
    with the inverse (no scatter-add, no zero-filled buffer)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse), None, None


def permute_rows(x: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """Rows `x[index]` (`index` a permutation of `x`'s rows, `inverse` its inverse), differentiable."""
    return _Permute.apply(x, index, inverse)


class _Dispatch(torch.autograd.Function):
    """Token rows copied to their `k` sorted (token, expert) rows: `flat[order // k]`. Backward: the
    rows' gradients back in pair order (`inverse` of `order`), summed over each token's k slots."""

    @staticmethod
    def forward(ctx, flat: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor, k: int) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        ctx.k = k
        return flat.index_select(0, torch.div(order, k, rounding_mode="floor"))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        tokens = inverse.numel() // ctx.k
        return grad.index_select(0, inverse).view(tokens, ctx.k, -1).sum(dim=1), None, None, None


# ---- modules --------------------------------------------------------------------------------------
class GroupedExperts(nn.Module):
    """`num_experts` SwiGLU experts held stacked: `gate_proj`, `up_proj` `[E,H,D]`, `down_proj` `[E,D,H]`.

    With `lora_rank`, each projection gets stacked adapters `<proj>_lora_a` `[E,r,in]` and
    `<proj>_lora_b` `[E,out,r]` (B = 0 at start, one adapter per expert) and the base is frozen; the
    adapters are scaled by `lora_alpha / lora_rank` (`/ sqrt(lora_rank)` with `use_rslora`).
    `forward(x [N,D] sorted by expert, counts [E] long) -> [N,D]`.
    """

    def __init__(
        self,
        num_experts: int,
        dim: int,
        hidden_dim: int,
        *,
        lora_rank: int = 0,
        lora_alpha: float = 16.0,
        use_rslora: bool = False,
    ) -> None:
        super().__init__()
        from engine.modules.peft.lora import lora_scale

        self.num_experts, self.dim, self.hidden_dim = num_experts, dim, hidden_dim
        self.lora_rank, self.lora_alpha, self.use_rslora = lora_rank, lora_alpha, use_rslora
        self.scale = lora_scale(lora_alpha, lora_rank, use_rslora) if lora_rank else 0.0
        self.disabled = False
        self.grad_scale = 1.0
        shapes = {
            "gate_proj": (hidden_dim, dim),
            "up_proj": (hidden_dim, dim),
            "down_proj": (dim, hidden_dim),
        }
        for name, (out_dim, in_dim) in shapes.items():
            weight = nn.Parameter(torch.empty(num_experts, out_dim, in_dim), requires_grad=not lora_rank)
            self.register_parameter(name, weight)
            if lora_rank:
                self.register_parameter(
                    f"{name}_lora_a", nn.Parameter(torch.empty(num_experts, lora_rank, in_dim))
                )
                self.register_parameter(
                    f"{name}_lora_b", nn.Parameter(torch.empty(num_experts, out_dim, lora_rank))
                )
        if not self.gate_proj.is_meta:
            self.reset_parameters()

    def adapter_names(self) -> tuple[str, ...]:
        """Local names of the adapter parameters (empty without LoRA)."""
        if not self.lora_rank:
            return ()
        return tuple(f"{p}_lora_{s}" for p in EXPERT_PROJS for s in ("a", "b"))

    def reset_parameters(self) -> None:
        """Base weights as a linear layer of each expert would start; adapters: A Kaiming, B = 0."""
        for name in EXPERT_PROJS:
            weight = getattr(self, name)
            bound = 1 / math.sqrt(weight.shape[-1])
            nn.init.uniform_(weight, -bound, bound)
        self.initialize_adapters()

    def initialize_adapters(self) -> None:
        for name in EXPERT_PROJS if self.lora_rank else ():
            a, b = getattr(self, f"{name}_lora_a"), getattr(self, f"{name}_lora_b")
            bound = 1 / math.sqrt(a.shape[-1])  # kaiming_uniform(a=sqrt(5)) of each [r,in] slice
            nn.init.uniform_(a, -bound, bound)
            nn.init.zeros_(b)

    def merged(self, name: str) -> torch.Tensor:
        """The effective stacked weight of projection `name`: base + scale * B @ A (differentiable)."""
        base = getattr(self, name)
        if not self.lora_rank or self.disabled:
            return base
        delta = torch.bmm(getattr(self, f"{name}_lora_b"), getattr(self, f"{name}_lora_a"))
        return base + (self.scale * delta).to(base.dtype)

    def merged_expert(self, name: str, expert: int) -> torch.Tensor:
        """`[out,in]` effective weight of one expert's projection `name` (no gradient)."""
        with torch.no_grad():
            base = getattr(self, name)[expert]
            if not self.lora_rank or self.disabled:
                return base.detach()
            a, b = getattr(self, f"{name}_lora_a")[expert], getattr(self, f"{name}_lora_b")[expert]
            return base + (self.scale * (b @ a)).to(base.dtype)

    def _weight(self, name: str) -> torch.Tensor:
        """Parameter `name` as a plain tensor: the local experts of an expert-parallel DTensor, with
        its gradient scaled by `grad_scale` (see `engine.training.expert_parallel`)."""
        w = getattr(self, name)
        if hasattr(w, "to_local"):
            w = w.to_local()
        return _ScaleGrad.apply(w, self.grad_scale) if self.grad_scale != 1.0 else w

    def _project(self, name: str, x: torch.Tensor, counts_list: list[int]) -> torch.Tensor:
        out = grouped_mm(x, self._weight(name), counts_list)
        if self.lora_rank and not self.disabled:
            a, b = self._weight(f"{name}_lora_a"), self._weight(f"{name}_lora_b")
            low = grouped_mm(x, a.to(x.dtype), counts_list)  # [N,r]
            out = out + grouped_mm(low, b.to(x.dtype), counts_list) * self.scale
        return out

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        # x: [N,D] sorted by expert; counts: [E] rows per expert -> [N,D]
        counts_list = counts.tolist()
        h = F.silu(self._project("gate_proj", x, counts_list))
        h = h * self._project("up_proj", x, counts_list)  # [N,H]
        return self._project("down_proj", h, counts_list)

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, dim={self.dim}, hidden_dim={self.hidden_dim}, lora_rank={self.lora_rank}"


@dataclass
class RouterStats:
    """One forward's routing, per token, for the auxiliary losses (`moe_aux_loss` sums it over the
    tokens a mask keeps). Holds `probs [T,E]` per layer: the tensor autograd keeps for the softmax's
    backward anyway, and what transformers keeps as `router_logits` for its own loss."""

    probs: torch.Tensor  # [T,E] fp32 router probabilities (with gradient)
    experts: torch.Tensor  # [T,k] long, the top-k experts of each token (no gradient)
    z: torch.Tensor  # [T] logsumexp(logits)^2 (with gradient)


class MoE(nn.Module):
    """Router + experts: `forward(x [B,S,D]) -> [B,S,D]`; the last forward's `RouterStats` in `stats`.

    Args:
        router (nn.Linear): `D -> E`, no bias. experts (GroupedExperts). settings (MoESettings).
    `dispatcher` (None: all experts are local) is set by expert parallelism
    (`engine.training.expert_parallel`): it runs the sorted tokens through experts held on other ranks.
    """

    def __init__(self, *, router: nn.Linear, experts: GroupedExperts, settings: MoESettings) -> None:
        super().__init__()
        self.router = router
        self.experts = experts
        self.settings = settings
        self.num_experts = settings.num_experts
        self.top_k = settings.top_k
        self.normalize = settings.norm_topk_prob or settings.naming == "mixtral"
        self.dispatcher = None
        self.stats: RouterStats | None = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`x [T,D] -> (logits [T,E], weights [T,k] in x's dtype, experts [T,k] long)`."""
        logits = self.router(x)  # [T,E]
        probs = torch.softmax(logits.float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        self.stats = RouterStats(
            probs=probs, experts=experts.detach(), z=torch.logsumexp(logits.float(), dim=-1).pow(2)
        )
        return logits, weights.to(x.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # [T,D]
        _, weights, experts = self.route(flat)  # [T,k] each
        return self._experts_forward(flat, weights, experts).reshape(shape)

    # Under `compile=true` the routed part runs eagerly between the block's compiled graphs (the
    # router, attention and norms are compiled): the rows per expert are data (`tolist()`), torch's
    # grouped GEMM traces only in bf16, and expert parallelism's all_to_all has data-dependent splits.
    @torch.compiler.disable
    def _experts_forward(
        self, flat: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor
    ) -> torch.Tensor:
        """`flat [T,D]`, routing `weights`/`experts` `[T,k]` -> `[T,D]`: sorted, computed, combined."""
        flat_experts = experts.reshape(-1)  # [T*k]: (token, slot) pairs
        order = torch.argsort(flat_experts, stable=True)  # sorted row -> pair, grouped by expert
        inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
        counts = torch.bincount(flat_experts, minlength=self.num_experts)  # [E]
        routed = _Dispatch.apply(flat, order, inverse, self.top_k)  # [T*k,D] rows flat[order // k]
        if self.dispatcher is None:
            out = self.experts(routed, counts)
        else:
            out = self.dispatcher(self.experts, routed, counts)
        pairs = permute_rows(out, inverse, order).view(*weights.shape, -1)  # [T,k,D] back in pair order
        return (pairs * weights.unsqueeze(-1)).sum(dim=1)  # [T,D]


def moe_layers(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def _pool(t: torch.Tensor) -> torch.Tensor:
    """Sum over every rank, gradients flowing back to each rank's share (autograd-aware)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t
    from torch.distributed.nn.functional import all_reduce

    return all_reduce(t, op=dist.ReduceOp.SUM)


def _token_weights(mask: torch.Tensor | None, tokens: int, device: torch.device) -> torch.Tensor | None:
    """`mask [B,S]` (True / 1 on real tokens) flattened to `[T]` fp32, as the routers flattened `x`."""
    if mask is None:
        return None
    if mask.numel() != tokens:
        raise ValueError(
            f"mask has {mask.numel()} entries for {tokens} routed tokens; pass the [B,S] attention mask "
            "of the batch the model last ran on"
        )
    return mask.reshape(-1).to(device=device, dtype=torch.float32)


def moe_aux_loss(
    model: nn.Module, *, mask: torch.Tensor | None = None, pooled: bool = False
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`(load_balancing_loss, z_loss)` of the model's last forward, or None for a dense model.

    Load balancing as transformers' `load_balancing_loss_func` (Switch Transformer, eqs. 4-6, with
    counts and probabilities pooled over all layers): `E * sum_e f_e * P_e`, where `f_e` is the top-k
    assignments of expert e per routed row and `P_e` its mean router probability. The z-loss is the
    mean over layers and tokens of `logsumexp(logits)^2` (ST-MoE). `mask` (`[B,S]`, True on real
    tokens: transformers' `attention_mask`) leaves padding out of the counts, the probabilities, the
    z-loss and the number of rows, as transformers does when given one; None counts every position.
    `pooled`: the figures are summed over all ranks first (autograd-aware), so N ranks with a batch
    each get the loss of one rank with all N batches. Unweighted: see `weighted_aux_loss`.
    Raises ValueError for a mask whose size is not the routed token count.
    """
    layers = moe_layers(model)
    if not layers or any(m.stats is None for m in layers):
        return None
    num_experts = layers[0].num_experts
    device = layers[0].stats.probs.device
    counts = torch.zeros(num_experts, dtype=torch.float32, device=device)  # [E] top-k assignments
    probs = torch.zeros(num_experts, dtype=torch.float32, device=device)  # [E] summed probabilities
    z = torch.zeros((), dtype=torch.float32, device=device)
    rows = torch.zeros((), dtype=torch.float32, device=device)
    for m in layers:
        s = m.stats
        w = _token_weights(mask, s.probs.shape[0], device)  # [T] or None
        flat = s.experts.reshape(-1)  # [T*k]
        if w is None:
            counts = counts + torch.bincount(flat, minlength=num_experts).float()
            probs = probs + s.probs.sum(dim=0)
            z = z + s.z.sum()
            rows = rows + s.probs.shape[0]
        else:
            per_slot = w.repeat_interleave(s.experts.shape[1])  # [T*k]: each token's k choices
            counts = counts + torch.zeros_like(counts).scatter_add_(0, flat, per_slot)
            probs = probs + (s.probs * w[:, None]).sum(dim=0)
            z = z + (s.z * w).sum()
            rows = rows + w.sum()
    if pooled:
        packed = _pool(torch.cat([counts, probs, z[None], rows[None]]))
        e = counts.shape[0]
        counts, probs, z, rows = packed[:e], packed[e : 2 * e], packed[2 * e], packed[2 * e + 1]
    rows = rows.clamp(min=1.0)  # an all-padding batch: zero, not nan
    balance = num_experts * ((counts / rows) * (probs / rows)).sum()
    return balance, z / rows


def weighted_aux_loss(
    model: nn.Module, *, mask: torch.Tensor | None = None, pooled: bool = False
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`(router_aux_loss_coef * balance + router_z_loss_coef * z, balance detached)` of the last
    forward, or None for a dense model (`mask`, `pooled` as in `moe_aux_loss`). The coefficients are
    the model config's (`MoESettings`, from `router_aux_loss_coef` / `router_z_loss_coef`)."""
    losses = moe_aux_loss(model, mask=mask, pooled=pooled)
    if losses is None:
        return None
    settings = moe_layers(model)[0].settings
    balance, z = losses
    return settings.router_aux_loss_coef * balance + settings.router_z_loss_coef * z, balance.detach()
