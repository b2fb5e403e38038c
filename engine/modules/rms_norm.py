"""Root-mean-square layer norm (Zhang & Sennrich, 2019), computed in fp32 like the reference models."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    """`x / rms(x) * weight` over the last dimension.

    Args:
        dim (int): size of the normalised (last) dimension.
        eps (float): added to the mean square before the root; default 1e-6.

    The statistics are taken in fp32 and the result is cast back to the input dtype before the
    scale is applied, which is what Llama/Qwen/Mistral checkpoints were trained with.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., dim]
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
