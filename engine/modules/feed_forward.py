"""SwiGLU feed-forward block: `down(silu(gate(x)) * up(x))`."""

import torch
import torch.nn.functional as F
from torch import nn


class FeedForward(nn.Module):
    """Gated MLP used by Llama, Qwen and Mistral.

    Args:
        gate_proj, up_proj (nn.Module): `D -> hidden` projections (plain or LoRA linears).
        down_proj (nn.Module): `hidden -> D` projection.
    """

    def __init__(self, *, gate_proj: nn.Module, up_proj: nn.Module, down_proj: nn.Module) -> None:
        super().__init__()
        self.gate_proj = gate_proj
        self.up_proj = up_proj
        self.down_proj = down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, D] -> [B, S, hidden] -> [B, S, D]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
