"""The MoE auxiliary losses in a recipe's objective: one helper every recipe but SFT uses (SFT weighs
them by loss tokens inside its own step statistics, with the same `weighted_aux_loss`).

    aux = RouterAuxLoss(self.model)                 # inactive (adds nothing) for a dense model
    logps = token_logprobs(self.model, tokens, labels)
    loss = loss_fn(...) + aux.term(mask)            # right after the model's own forward
    # ... the rest of the step ...
    metrics.update(aux.metrics())                   # {"loss/aux": mean load-balancing loss} or {}

`term(mask)` reads the routers of the model's *last* forward, so call it before anything else runs the
same model (a LoRA reference is the same module with its adapters off). `mask [B,S]` is True on real
tokens (transformers' `attention_mask`): padding is left out, as transformers' `load_balancing_loss_func`
does. The weights are the model config's `router_aux_loss_coef` (and `router_z_loss_coef`).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.modules.moe import moe_layers, weighted_aux_loss


class RouterAuxLoss:
    """`router_aux_loss_coef * load_balancing + router_z_loss_coef * z_loss` of one model's forwards,
    and the mean unweighted load-balancing loss over the terms taken since the last `metrics()`.

    Args:
        model: the trained model (a dense one makes `term` 0 and `metrics` empty).
        name: the metric's name (default `loss/aux`).
    """

    def __init__(self, model: nn.Module, name: str = "loss/aux") -> None:
        self.model = model
        self.name = name
        self.active = bool(moe_layers(model))
        self._sum: torch.Tensor | float = 0.0
        self._weight = 0.0

    def term(self, mask: torch.Tensor | None, *, weight: float = 1.0) -> torch.Tensor | float:
        """The weighted auxiliary loss of the model's last forward over the tokens `mask` keeps, to add
        to the loss (0 for a dense model). `weight`: this term's share in `metrics()`'s mean (e.g. a
        micro-batch's token share when the recipe weighs micro-batches so)."""
        if not self.active:
            return 0.0
        aux = weighted_aux_loss(self.model, mask=mask)
        if aux is None:  # a model whose routers have not run (no forward yet)
            return 0.0
        weighted, balance = aux
        self._sum = self._sum + balance * weight  # on the device: read once per step in metrics()
        self._weight += weight
        return weighted

    def metrics(self) -> dict[str, float]:
        """`{name: mean load-balancing loss}` of the terms since the last call (empty for a dense
        model or when none was taken); resets the mean."""
        if not self.active or self._weight == 0:
            return {}
        value = float(self._sum) / self._weight
        self._sum, self._weight = 0.0, 0.0
        return {self.name: value}
