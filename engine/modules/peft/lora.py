"""LoRA / DoRA linear layers over a frozen base weight, optionally stored as NF4 (QLoRA).

Parameter names: the frozen base keeps the plain linear's names (`weight`, `bias`) so a LoRA model
loads and saves the same checkpoint keys as the full model; adapters are `lora_a.weight [r, in]`,
`lora_b.weight [out, r]` and, for DoRA, `magnitude [out]`. PEFT's layout is a rename of these
(`lora_a` -> `lora_A`, `lora_b` -> `lora_B`, `magnitude` -> `lora_magnitude_vector`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

NF4_BLOCK_SIZE = 64
NF4_SCALER_BLOCK_SIZE = 256


def _nf4_cls():
    from engine.modules.torchao_import import import_torchao

    return import_torchao("torchao.quantization").NF4Tensor


def nf4_block_sizes(numel: int) -> tuple[int, int]:
    """`(block_size, scaler_block_size)` for an NF4 weight of `numel` elements.

    Blocks of 64 weights share one absmax scaler (QLoRA's choice); the scalers are quantised again
    in groups of 256, or of the largest power of two below 256 that divides their count (SmolLM2's
    576-wide matrices need 64). Raises ValueError when numel is not a multiple of 64.
    """
    if numel % NF4_BLOCK_SIZE:
        raise ValueError(
            f"NF4 needs a weight whose size is a multiple of {NF4_BLOCK_SIZE}, got {numel} elements; "
            "set quantize_base=False"
        )
    n_scalers = numel // NF4_BLOCK_SIZE
    scaler_block = NF4_SCALER_BLOCK_SIZE
    while n_scalers % scaler_block:
        scaler_block //= 2
    return NF4_BLOCK_SIZE, scaler_block


def to_nf4(weight: torch.Tensor) -> torch.Tensor:
    """Quantise a 2-D weight to torchao's NF4 (blocks of 64, double-quantised scalers; see
    `nf4_block_sizes`). Raises ValueError when the size is not a multiple of 64."""
    from engine.modules.torchao_import import import_torchao

    _to_nf4 = import_torchao("torchao.quantization").to_nf4
    block, scaler_block = nf4_block_sizes(weight.numel())
    return _to_nf4(weight.detach(), block, scaler_block)


def is_nf4(t: torch.Tensor) -> bool:
    try:
        return isinstance(t, _nf4_cls())
    except ImportError:
        return False


def nf4_shardable(weight: torch.Tensor, shards: int) -> bool:
    """Whether FSDP2 can split an NF4 weight into `shards` equal row chunks: the rows and each of its
    packed tensors (values, per-block scalers, per-group scaler factors) divide evenly. torchao's NF4
    splits those tensors as they are, so a chunk must hold whole blocks and whole scaler groups."""
    if weight.dim() != 2 or weight.shape[0] % shards:
        return False
    packed = (weight.quantized_data, weight.quantized_scalers, weight.quantization_factor)
    return all(t.numel() % shards == 0 for t in packed)


def dequantize(weight: torch.Tensor) -> torch.Tensor:
    """The plain tensor behind `weight` (NF4 dequantised, otherwise returned as is)."""
    return weight.get_original_weight() if is_nf4(weight) else weight


def lora_scale(alpha: float, rank: int, use_rslora: bool = False) -> float:
    """The adapter's scale: `alpha / rank` (LoRA), or `alpha / sqrt(rank)` (rsLoRA, Kalajdzievski 2023:
    the update's size stays put as the rank grows, PEFT's `use_rslora=True`)."""
    return alpha / math.sqrt(rank) if use_rslora else alpha / rank


class LoRALinear(nn.Module):
    """`y = W x + b + scale * B A dropout(x)` with W (and b) frozen; `scale = alpha / rank`, or
    `alpha / sqrt(rank)` with `use_rslora` (see `lora_scale`).

    Args:
        in_dim (int), out_dim (int): base linear sizes.
        rank (int): adapter rank r (> 0).
        alpha (float): scale numerator; the update is scaled by `alpha / rank`
            (`alpha / sqrt(rank)` with `use_rslora`).
        dropout (float): dropout on the adapter input; default 0.
        use_bias (bool): whether the base linear has a (frozen) bias; default False.
        quantize_base (bool): store W as NF4 and dequantise on the fly (QLoRA); default False.
        use_dora (bool): weight-decomposed LoRA (Liu et al., 2024) with a trainable `magnitude`.
        use_rslora (bool): rank-stabilised scale `alpha / sqrt(rank)`; default False.

    Raises ValueError for rank < 1 and for NF4 on a weight torchao cannot block (see `to_nf4`).
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        rank: int,
        alpha: float,
        dropout: float = 0.0,
        use_bias: bool = False,
        quantize_base: bool = False,
        use_dora: bool = False,
        use_rslora: bool = False,
    ) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"lora_rank must be >= 1, got {rank}")
        self.in_dim, self.out_dim, self.rank, self.alpha = in_dim, out_dim, rank, alpha
        self.use_rslora = use_rslora
        self.scale = lora_scale(alpha, rank, use_rslora)
        self.quantize_base = quantize_base
        self.use_dora = use_dora
        self.disabled = False
        base = nn.Linear(in_dim, out_dim, bias=use_bias)
        self.weight = nn.Parameter(base.weight.detach(), requires_grad=False)
        self.bias = nn.Parameter(base.bias.detach(), requires_grad=False) if use_bias else None
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.lora_a = nn.Linear(in_dim, rank, bias=False)
        self.lora_b = nn.Linear(rank, out_dim, bias=False)
        self.magnitude = nn.Parameter(torch.ones(out_dim)) if use_dora else None
        if not self.weight.is_meta:
            self.initialize_adapters()
            if quantize_base:
                self.quantize_base_()

    # ---- set-up ---------------------------------------------------------------------------
    def initialize_adapters(self) -> None:
        """A ~ Kaiming-uniform, B = 0 (the adapted layer starts equal to the base); DoRA m = ||W||_row."""
        nn.init.kaiming_uniform_(self.lora_a.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_b.weight)
        if self.magnitude is not None:
            with torch.no_grad():
                self.magnitude.copy_(self._base_weight().float().norm(dim=1).to(self.magnitude.dtype))

    def quantize_base_(self) -> None:
        """Replace the base weight by its NF4 form (idempotent); called by loaders after assigning W."""
        if self.quantize_base and not is_nf4(self.weight):
            self.weight = nn.Parameter(to_nf4(self.weight), requires_grad=False)

    def _base_weight(self) -> torch.Tensor:
        return dequantize(self.weight)

    # ---- math -----------------------------------------------------------------------------
    def delta_weight(self) -> torch.Tensor:
        """`scale * B @ A`, `[out, in]`."""
        return self.scale * (self.lora_b.weight @ self.lora_a.weight)

    def merged_weight(self) -> torch.Tensor:
        """The effective dense weight `[out, in]` (differentiable w.r.t. the adapters)."""
        base = self._base_weight()
        if self.disabled:
            return base
        combined = base + self.delta_weight().to(base.dtype)
        if self.magnitude is None:
            return combined
        norm = combined.float().norm(dim=1, keepdim=True).detach().to(base.dtype)  # [out,1]
        return combined * (self.magnitude.to(base.dtype)[:, None] / norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        out = F.linear(x, self.weight, self.bias)  # NF4 weights dequantise inside F.linear
        if self.disabled:
            return out
        lora = self.lora_b(self.lora_a(self.dropout(x))) * self.scale
        if self.magnitude is None:
            return out + lora
        # DoRA: rescale rows of (W + scale*BA) to the learned magnitude; the norm is detached
        # (as in the paper, section 4.3) so it costs no extra backward graph.
        with torch.no_grad():
            combined = self._base_weight() + self.delta_weight().to(out.dtype)
            norm = combined.float().norm(dim=1).to(out.dtype)  # [out]
        factor = self.magnitude.to(out.dtype) / norm
        base_no_bias = out if self.bias is None else out - self.bias
        adapted = factor * (base_no_bias + lora)
        return adapted if self.bias is None else adapted + self.bias

    def extra_repr(self) -> str:
        return (
            f"in_dim={self.in_dim}, out_dim={self.out_dim}, rank={self.rank}, alpha={self.alpha}, "
            f"nf4={self.quantize_base}, dora={self.use_dora}, rslora={self.use_rslora}"
        )
