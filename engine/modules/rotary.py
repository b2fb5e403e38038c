"""Rotary position embeddings (RoPE) in the "rotate half" layout used by Hugging Face checkpoints.

The cos/sin tables are precomputed once for `max_seq_len` positions in fp32 and gathered by
position id, so packed documents (position ids restarting per document) and left-padded batches
cost nothing extra. Frequency schedules: the default `base ** (-2i/d)` and the Llama-3 scaling
(long wavelengths divided by `factor`, short ones kept, a smooth blend in between).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1+ frequency scaling. Defaults are those of Llama 3.1/3.2/3.3 checkpoints."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


def default_inv_freq(head_dim: int, base: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """Inverse frequencies `[head_dim // 2]` (fp32): `1 / base ** (2i / head_dim)`."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    return 1.0 / (base**exponents)


def llama3_inv_freq(
    head_dim: int, base: float, scaling: Llama3RopeScaling, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Default inverse frequencies rescaled per Llama 3.1: see `Llama3RopeScaling`."""
    inv_freq = default_inv_freq(head_dim, base, device)
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor  # longer than this: divide by factor
    high_wavelen = old_len / scaling.high_freq_factor  # shorter than this: keep
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    # Between the two thresholds, interpolate linearly in 1/wavelength between scaled and kept.
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    in_between = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(in_between, blended, scaled)


class RotaryEmbedding(nn.Module):
    """Precomputed RoPE tables, shared by every attention layer of a decoder.

    Args:
        head_dim (int): per-head dimension (even).
        max_seq_len (int): number of positions tabulated.
        base (float): RoPE theta; default 10000.
        scaling (Llama3RopeScaling | None): Llama-3 frequency scaling, or None for the default schedule.

    `forward(position_ids [B,S] or [1,S] long, dtype) -> (cos, sin)`, each `[B|1,S,head_dim]` in `dtype`.
    Raises ValueError for an odd head_dim; a position id >= max_seq_len raises IndexError (torch).
    """

    def __init__(
        self, head_dim: int, max_seq_len: int, base: float = 10000.0, scaling: Llama3RopeScaling | None = None
    ) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE head_dim must be even, got {head_dim}")
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.base = base
        self.scaling = scaling
        self.register_buffer("cos_table", torch.empty(0), persistent=False)
        self.register_buffer("sin_table", torch.empty(0), persistent=False)
        self.rope_init()

    def inv_freq(self, device: torch.device | str = "cpu") -> torch.Tensor:
        if self.scaling is None:
            return default_inv_freq(self.head_dim, self.base, device)
        return llama3_inv_freq(self.head_dim, self.base, self.scaling, device)

    def rope_init(self, device: torch.device | str | None = None) -> None:
        """(Re)build the tables; called at construction and after a model leaves the meta device."""
        device = torch.device(device) if device is not None else self.cos_table.device
        if device.type == "meta":  # shapes only; rebuilt once the model has real storage
            self.cos_table = torch.empty(self.max_seq_len, self.head_dim, device=device)
            self.sin_table = torch.empty(self.max_seq_len, self.head_dim, device=device)
            return
        inv_freq = self.inv_freq(device)
        positions = torch.arange(self.max_seq_len, device=device, dtype=torch.int64).float()
        freqs = torch.outer(positions, inv_freq)  # [L, head_dim/2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [L, head_dim]
        self.cos_table = angles.cos()
        self.sin_table = angles.sin()

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cos_table.device != position_ids.device or self.cos_table.is_meta:
            self.rope_init(position_ids.device)
        # position_ids: [B, S] -> cos/sin [B, S, head_dim]
        return self.cos_table[position_ids].to(dtype), self.sin_table[position_ids].to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x [B,H,S,hd]` by angles whose cos/sin are `[B,1,S,hd]` (rotate-half layout)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin
