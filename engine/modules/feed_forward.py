"""SwiGLU feed-forward block: `down(silu(gate(x)) * up(x))`, gate and up apart or fused (Phi-3)."""

import torch
import torch.nn.functional as F
from torch import nn


class FeedForward(nn.Module):
    """Gated MLP used by Llama, Qwen, Mistral and (fused) Phi-3.

    Args:
        gate_proj, up_proj (nn.Module | None): `D -> hidden` projections (plain or LoRA linears).
        down_proj (nn.Module): `hidden -> D` projection.
        gate_up_proj (nn.Module | None): instead of gate and up, one `D -> 2 * hidden` projection whose
            first half is the gate (Phi-3's `gate_up_proj`).
    Raises ValueError unless exactly one of gate_proj + up_proj or gate_up_proj is given.
    """

    def __init__(
        self,
        *,
        gate_proj: nn.Module | None = None,
        up_proj: nn.Module | None = None,
        down_proj: nn.Module,
        gate_up_proj: nn.Module | None = None,
    ) -> None:
        super().__init__()
        separate = (gate_proj is not None, up_proj is not None)
        if (gate_up_proj is None and separate != (True, True)) or (
            gate_up_proj is not None and any(separate)
        ):
            raise ValueError("give either gate_proj and up_proj, or one fused gate_up_proj")
        self.gate_proj = gate_proj
        self.up_proj = up_proj
        self.gate_up_proj = gate_up_proj
        self.down_proj = down_proj

    @property
    def hidden_dim(self) -> int:
        if self.gate_up_proj is not None:
            return int(self.gate_up_proj.weight.shape[0]) // 2
        return int(self.gate_proj.weight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, D] -> [B, S, hidden] -> [B, S, D]
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [B, S, 2*hidden] -> 2 x [B, S, hidden]
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
