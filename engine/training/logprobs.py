"""Per-token log-probabilities of given targets under a decoder, without holding `[B,S,V]` logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def _chunk_logps(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float):
    """hidden [B,C,D], weight [V,D], targets [B,C] (>= 0) -> log p(target) [B,C] fp32."""
    logits = (hidden @ weight.t()).float() / temperature  # [B,C,V]
    return torch.gather(F.log_softmax(logits, dim=-1), -1, targets.unsqueeze(-1)).squeeze(-1)


def token_logprobs(
    model: nn.Module,
    tokens: torch.Tensor,
    labels: torch.Tensor,
    *,
    position_ids: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int = 256,
    ignore_index: int = -100,
) -> torch.Tensor:
    """`log p(labels[b, i] | tokens[b, :i+1])` as `[B,S]` fp32, 0 where `labels == ignore_index`.

    `labels` are already shifted (the dataset convention: `labels[i]` is the token after position i).
    The vocabulary projection runs `chunk_size` positions at a time and is recomputed in backward, so
    at most one `[B, chunk_size, V]` block exists. Calls the module (FSDP2 hooks stay in the path).
    """
    from engine.training.runtime import forward_replaced

    def hidden_then_logps(toks, **kw):
        hidden = model.forward_hidden(toks, **kw)  # [B,S,D]
        weight = model.output_weight  # [V,D], gathered inside the root call under FSDP2
        safe = labels.clamp(min=0)
        parts = []
        for s in range(0, hidden.shape[1], chunk_size):
            sl = slice(s, s + chunk_size)
            if torch.is_grad_enabled():
                parts.append(
                    checkpoint(
                        _chunk_logps, hidden[:, sl], weight, safe[:, sl], temperature, use_reentrant=False
                    )
                )
            else:
                parts.append(_chunk_logps(hidden[:, sl], weight, safe[:, sl], temperature))
        return torch.cat(parts, dim=1)

    with forward_replaced(model, hidden_then_logps):
        logps = model(tokens, position_ids=position_ids)
    return logps.masked_fill(labels == ignore_index, 0.0)
