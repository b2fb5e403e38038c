"""Choosing the next token from logits: greedy, temperature, top-k, top-p (nucleus)."""

from __future__ import annotations

import torch


def filter_logits(
    logits: torch.Tensor, *, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Set to -inf every logit outside the top `top_k` and outside the smallest set whose
    probability reaches `top_p` (the most likely token always stays). `logits`: `[B,V]` -> `[B,V]`."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B,1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B,V]
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # probability of the strictly better tokens
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def sample_next_token(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token per row. `logits`: `[B,V]` (any float dtype) -> `[B]` long.

    `temperature=0` is greedy (argmax; top-k/top-p do not change it). Otherwise logits are divided by
    `temperature`, filtered by `top_k`/`top_p`, and one token is drawn per row with `generator`.
    """
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    scaled = filter_logits(logits.float() / temperature, top_k=top_k, top_p=top_p)
    probs = torch.softmax(scaled, dim=-1)  # [B,V]
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
