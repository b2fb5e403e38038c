"""RoPE frequency schedules beyond the default one, and their Hugging Face `rope_parameters` spelling.

Each schedule is a frozen dataclass with the same three members, which `RotaryEmbedding` uses:

- `inv_freq(dim, base, device, seq_len=None) -> [dim // 2]` fp32 inverse frequencies; `seq_len` is
  the length the frequencies are for (the largest position + 1 of a forward), None for the tables.
- `attention_scale`: a factor on cos and sin (so on q.k), 1.0 for all but YaRN and LongRoPE.
- `switch_len`: None, or the length above which the schedule changes (dynamic NTK: its base grows
  with the length; LongRoPE: long factors instead of short ones). `RotaryEmbedding` then computes the
  angles of a longer forward on the fly instead of reading its table.

The schedules (math from the papers; transformers' `modeling_rope_utils` is what tests compare with):

- linear (position interpolation): every frequency divided by `factor`.
- dynamic NTK: for a length L beyond `original_max_position_embeddings` (L0), the base becomes
  `base * (factor * L / L0 - (factor - 1)) ** (dim / (dim - 2))`; up to L0 the default schedule.
- YaRN: frequencies whose wavelength fits `beta_fast`+ times in L0 are kept, those fitting fewer than
  `beta_slow` times are divided by `factor`, a linear ramp over the dimensions between; cos and sin
  are scaled by `attention_factor` (default `0.1 ln(factor) + 1`, or the `mscale` / `mscale_all_dim`
  ratio DeepSeek configs give).
- LongRoPE (Phi-3): per-frequency divisors, `short_factor` up to L0 and `long_factor` beyond, with
  cos/sin scaled by `attention_factor` (default `sqrt(1 + ln(factor) / ln(L0))`).
- Llama 3: `engine.modules.rotary.Llama3RopeScaling`.

`from_rope_parameters` reads a HF block (`rope_scaling` or `rope_parameters`, merged) into one of these;
`to_rope_parameters` writes one back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.modules.rotary import Llama3RopeScaling, default_inv_freq


class RopeScaling(Protocol):
    """What `RotaryEmbedding` asks of a schedule (see the module docstring)."""

    attention_scale: float
    switch_len: int | None

    def inv_freq(
        self, dim: int, base: float, device: torch.device | str = "cpu", seq_len: int | None = None
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class LinearRopeScaling:
    """Position interpolation: positions (so frequencies) divided by `factor`."""

    factor: float

    attention_scale = 1.0
    switch_len = None

    def inv_freq(self, dim, base, device="cpu", seq_len=None) -> torch.Tensor:
        return default_inv_freq(dim, base, device) / self.factor


@dataclass(frozen=True)
class DynamicNTKRopeScaling:
    """NTK-aware base growth with the length; default frequencies up to `original_max_position_embeddings`
    (HF's `max_position_embeddings`; the model's own `max_seq_len` is `factor` times that)."""

    factor: float
    original_max_position_embeddings: int

    attention_scale = 1.0
    # Generation with a KV cache keeps the keys as they were rotated when cached (each step's new token
    # gets the base of its own length), as transformers' `generate` does: not equal to re-encoding.
    recompute_cache_on_switch = False

    @property
    def switch_len(self) -> int:
        return self.original_max_position_embeddings

    def inv_freq(self, dim, base, device="cpu", seq_len=None) -> torch.Tensor:
        if seq_len is None or seq_len <= self.original_max_position_embeddings:
            return default_inv_freq(dim, base, device)
        # In fp32 tensors, as the reference computes it (a float64 base differs in the last bits).
        length = torch.tensor(float(seq_len), dtype=torch.float32, device=device)
        ratio = self.factor * length / self.original_max_position_embeddings - (self.factor - 1)
        grown = base * ratio ** (dim / (dim - 2))  # 0-dim fp32
        exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
        return 1.0 / (grown**exponents)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class YarnRopeScaling:
    """YaRN ("NTK-by-parts" interpolation + attention temperature), as in Qwen2.5/Qwen3 long-context configs.

    factor: context extension (e.g. 4.0: 32k -> 128k). original_max_position_embeddings: L0.
    beta_fast, beta_slow: rotation counts bounding the ramp (32, 1). truncate: round the ramp's
    bounds to whole dimensions (True, as the paper; gpt-oss sets False). attention_factor: the cos/sin
    scale; None derives it from `factor` (and `mscale` / `mscale_all_dim` when both are given).
    """

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None

    switch_len = None

    @property
    def attention_scale(self) -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:
            return _yarn_mscale(self.factor, self.mscale) / _yarn_mscale(self.factor, self.mscale_all_dim)
        return _yarn_mscale(self.factor)

    def _ramp_bounds(self, dim: int, base: float) -> tuple[float, float]:
        """The dimensions (of `dim // 2`) where the ramp from kept to interpolated starts and ends."""

        def dim_of(rotations: float) -> float:  # the dimension whose wavelength fits `rotations` times in L0
            turns = self.original_max_position_embeddings / (rotations * 2 * math.pi)
            return dim * math.log(turns) / (2 * math.log(base))

        low, high = dim_of(self.beta_fast), dim_of(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, dim - 1)

    def inv_freq(self, dim, base, device="cpu", seq_len=None) -> torch.Tensor:
        powers = base ** (torch.arange(0, dim, 2, device=device).float() / dim)  # [dim/2]
        kept, interpolated = 1.0 / powers, 1.0 / (self.factor * powers)
        low, high = self._ramp_bounds(dim, base)
        if low == high:
            high += 0.001  # a one-dimension ramp: avoid dividing by zero
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        keep = (1 - ramp).to(device)  # 1: kept (high frequency), 0: interpolated (low frequency)
        return interpolated * (1 - keep) + kept * keep


@dataclass(frozen=True)
class LongRopeScaling:
    """LongRoPE (Phi-3/3.5/4-mini): `inv_freq_i = 1 / (factor_i * base ** (2i / dim))`, `short_factor` for
    lengths up to `original_max_position_embeddings`, `long_factor` beyond; each has `dim // 2` entries.

    factor: the context extension (HF: `max_position_embeddings / original_max_position_embeddings`
    when absent), used only to derive `attention_factor` when that is None.
    """

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    factor: float = 1.0
    attention_factor: float | None = None

    # Generation with a KV cache re-encodes the whole sequence once it grows past `switch_len`, so the
    # cached keys are rotated by the long factors too (transformers' Phi-3 `generate` does the same).
    recompute_cache_on_switch = True

    @property
    def switch_len(self) -> int:
        return self.original_max_position_embeddings

    @property
    def attention_scale(self) -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_position_embeddings))

    def inv_freq(self, dim, base, device="cpu", seq_len=None) -> torch.Tensor:
        long = seq_len is not None and seq_len > self.original_max_position_embeddings
        factors = torch.tensor(
            self.long_factor if long else self.short_factor, dtype=torch.float32, device=device
        )
        if factors.numel() != dim // 2:
            raise ValueError(
                f"LongRoPE {'long' if long else 'short'}_factor has {factors.numel()} entries; the rotary "
                f"dimension {dim} needs {dim // 2}"
            )
        exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
        return 1.0 / (factors * base**exponents)


ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")


def _number(params: dict, key: str, kind=float):
    if key not in params or params[key] is None:
        raise ValueError(f"rope_parameters.{key} is missing")
    value = params[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"rope_parameters.{key} must be a number, got {value!r}")
    return kind(value)


def _factors(params: dict, key: str, dim: int) -> tuple[float, ...]:
    value = params.get(key)
    if not isinstance(value, list) or not all(isinstance(x, (int, float)) for x in value):
        raise ValueError(f"rope_parameters.{key} must be a list of {dim // 2} numbers, got {value!r}")
    if len(value) != dim // 2:
        raise ValueError(
            f"rope_parameters.{key} has {len(value)} entries; the rotary dimension {dim} needs {dim // 2}"
        )
    return tuple(float(x) for x in value)


def from_rope_parameters(
    params: dict,
    *,
    max_position_embeddings: int,
    rotary_dim: int,
    original_max_position_embeddings: int | None,
) -> RopeScaling | None:
    """The schedule of a HF rope block (`rope_type` or the older `type`), None for `default`.

    max_position_embeddings: config.json's; the dynamic NTK threshold, and the LongRoPE/YaRN `factor`
    or L0 where the block leaves them out (as transformers derives them).
    original_max_position_embeddings: a top-level config.json field of that name (Phi-3 keeps it
    there); it wins over the block's, as in transformers.
    Raises ValueError naming the `rope_parameters` field that is missing, mistyped or of unknown type.
    """
    kind = params.get("rope_type", params.get("type", "default"))
    original = original_max_position_embeddings or params.get("original_max_position_embeddings")
    if kind == "default":
        return None
    if kind == "linear":
        return LinearRopeScaling(factor=_number(params, "factor"))
    if kind == "dynamic":
        return DynamicNTKRopeScaling(
            factor=_number(params, "factor"), original_max_position_embeddings=max_position_embeddings
        )
    if kind == "llama3":
        return Llama3RopeScaling(
            factor=_number(params, "factor"),
            low_freq_factor=_number(params, "low_freq_factor"),
            high_freq_factor=_number(params, "high_freq_factor"),
            original_max_position_embeddings=int(original or max_position_embeddings),
        )
    if kind == "yarn":
        original = int(original or max_position_embeddings)
        factor = params.get("factor")
        truncate = params.get("truncate", True)
        if not isinstance(truncate, bool):
            raise ValueError(f"rope_parameters.truncate must be true or false, got {truncate!r}")
        optional = {
            k: _number(params, k)
            for k in ("attention_factor", "mscale", "mscale_all_dim")
            if params.get(k) is not None
        }
        return YarnRopeScaling(
            factor=_number(params, "factor") if factor is not None else max_position_embeddings / original,
            original_max_position_embeddings=original,
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            truncate=truncate,
            **optional,
        )
    if kind == "longrope":
        original = int(original or max_position_embeddings)
        factor = params.get("factor")
        attention = params.get("attention_factor")
        return LongRopeScaling(
            short_factor=_factors(params, "short_factor", rotary_dim),
            long_factor=_factors(params, "long_factor", rotary_dim),
            original_max_position_embeddings=original,
            factor=_number(params, "factor") if factor is not None else max_position_embeddings / original,
            attention_factor=None if attention is None else _number(params, "attention_factor"),
        )
    raise ValueError(
        f"rope_parameters.rope_type {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
    )


def to_rope_parameters(scaling: RopeScaling | None, base: float) -> dict:
    """The HF `rope_parameters` block of a schedule (`rope_type` `default` for None)."""
    params: dict = {"rope_type": "default", "rope_theta": base}
    if isinstance(scaling, Llama3RopeScaling):
        params.update(rope_type="llama3", factor=scaling.factor, low_freq_factor=scaling.low_freq_factor,
                      high_freq_factor=scaling.high_freq_factor,
                      original_max_position_embeddings=scaling.original_max_position_embeddings)  # fmt: skip
    elif isinstance(scaling, LinearRopeScaling):
        params.update(rope_type="linear", factor=scaling.factor)
    elif isinstance(scaling, DynamicNTKRopeScaling):
        params.update(rope_type="dynamic", factor=scaling.factor)
    elif isinstance(scaling, YarnRopeScaling):
        params.update(rope_type="yarn", factor=scaling.factor,
                      original_max_position_embeddings=scaling.original_max_position_embeddings,
                      beta_fast=scaling.beta_fast, beta_slow=scaling.beta_slow, truncate=scaling.truncate)  # fmt: skip
        for key in ("attention_factor", "mscale", "mscale_all_dim"):
            if getattr(scaling, key) is not None:
                params[key] = getattr(scaling, key)
    elif isinstance(scaling, LongRopeScaling):
        params.update(rope_type="longrope", factor=scaling.factor, short_factor=list(scaling.short_factor),
                      long_factor=list(scaling.long_factor),
                      original_max_position_embeddings=scaling.original_max_position_embeddings)  # fmt: skip
        if scaling.attention_factor is not None:
            params["attention_factor"] = scaling.attention_factor
    elif scaling is not None:
        raise ValueError(f"unknown RoPE schedule {type(scaling).__name__}")
    return params


def model_max_seq_len(scaling: RopeScaling | None, max_position_embeddings: int) -> int:
    """The native `max_seq_len` of a HF config: dynamic NTK is made for `factor` times its threshold."""
    if isinstance(scaling, DynamicNTKRopeScaling):
        return int(max_position_embeddings * scaling.factor)
    return max_position_embeddings


def hf_max_position_embeddings(scaling: RopeScaling | None, max_seq_len: int) -> int:
    """The inverse of `model_max_seq_len`: config.json's `max_position_embeddings` of a native model."""
    if isinstance(scaling, DynamicNTKRopeScaling):
        return scaling.original_max_position_embeddings
    return max_seq_len
