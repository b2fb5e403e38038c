"""Rotary position embeddings (RoPE) in the "rotate half" layout used by Hugging Face checkpoints.

The cos/sin tables are precomputed once for `max_seq_len` positions in fp32 and gathered by
position id, so packed documents (position ids restarting per document) and left-padded batches
cost nothing extra. Frequency schedules: the default `base ** (-2i/d)`, the Llama-3 scaling
(long wavelengths divided by `factor`, short ones kept, a smooth blend in between) and those of
`engine.modules.rope_scaling` (linear, dynamic NTK, YaRN, LongRoPE). A schedule that changes with
the length (dynamic NTK, LongRoPE) is computed on the fly for a forward whose largest position is
past its `switch_len`. Partial rotary (`rotary_dim < head_dim`, Phi) rotates the first `rotary_dim`
dimensions of each head and passes the rest through.
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

    attention_scale = 1.0
    switch_len = None

    def inv_freq(self, dim, base, device="cpu", seq_len=None) -> torch.Tensor:
        return llama3_inv_freq(dim, base, self, device)


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
        scaling: a frequency schedule (`Llama3RopeScaling` or one of `engine.modules.rope_scaling`),
            or None for the default one.
        rotary_dim (int | None): dimensions of each head that rotate (even); None is all of head_dim.

    `forward(position_ids [B,S] or [1,S] long, dtype) -> (cos, sin)`, each `[B|1,S,rotary_dim]` in
    `dtype`. With a length-dependent schedule the largest position id is read on the host (one sync).
    Raises ValueError for an odd rotary dimension; a position id >= max_seq_len raises IndexError (torch).
    """

    def __init__(
        self,
        head_dim: int,
        max_seq_len: int,
        base: float = 10000.0,
        scaling=None,
        rotary_dim: int | None = None,
    ) -> None:
        super().__init__()
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise ValueError(
                f"RoPE rotary dimension must be even and in 2..head_dim ({head_dim}), got {rotary_dim}"
            )
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim  # the tables' width
        self.max_seq_len = max_seq_len
        self.base = base
        self.scaling = scaling
        self.register_buffer("cos_table", torch.empty(0), persistent=False)
        self.register_buffer("sin_table", torch.empty(0), persistent=False)
        self.rope_init()

    def inv_freq(self, device: torch.device | str = "cpu", seq_len: int | None = None) -> torch.Tensor:
        if self.scaling is None:
            return default_inv_freq(self.rotary_dim, self.base, device)
        return self.scaling.inv_freq(self.rotary_dim, self.base, device, seq_len)

    def _angles(self, positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos, sin `[..., rotary_dim]` of `positions [...]` (any integer shape)."""
        freqs = positions[..., None].float() * inv_freq  # [..., rotary_dim/2]
        angles = torch.cat((freqs, freqs), dim=-1)  # [..., rotary_dim]
        scale = 1.0 if self.scaling is None else self.scaling.attention_scale
        return angles.cos() * scale, angles.sin() * scale

    def rope_init(self, device: torch.device | str | None = None) -> None:
        """(Re)build the tables; called at construction and after a model leaves the meta device."""
        device = torch.device(device) if device is not None else self.cos_table.device
        if device.type == "meta":  # shapes only; rebuilt once the model has real storage
            self.cos_table = torch.empty(self.max_seq_len, self.rotary_dim, device=device)
            self.sin_table = torch.empty(self.max_seq_len, self.rotary_dim, device=device)
            return
        positions = torch.arange(self.max_seq_len, device=device, dtype=torch.int64)
        self.cos_table, self.sin_table = self._angles(positions, self.inv_freq(device))  # [L, rotary_dim]

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cos_table.device != position_ids.device or self.cos_table.is_meta:
            self.rope_init(position_ids.device)
        switch = None if self.scaling is None else self.scaling.switch_len
        if switch is not None:
            seq_len = int(position_ids.max()) + 1
            if seq_len > switch:  # the long-context schedule, for every position of this forward
                cos, sin = self._angles(position_ids, self.inv_freq(position_ids.device, seq_len))
                return cos.to(dtype), sin.to(dtype)
        # position_ids: [B, S] -> cos/sin [B, S, rotary_dim]
        return self.cos_table[position_ids].to(dtype), self.sin_table[position_ids].to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x [B,H,S,hd]` by angles whose cos/sin are `[B,1,S,rd]` (rotate-half layout); with
    `rd < hd` (partial rotary) the first `rd` dimensions rotate and the rest pass through."""
    rotary_dim = cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        rotated = apply_rotary(x[..., :rotary_dim], cos, sin)
        return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin
