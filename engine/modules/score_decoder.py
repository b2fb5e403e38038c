"""A decoder with a scalar head: reward models and PPO value models.

The same blocks as `TransformerDecoder`, but the final hidden states go through `score`, a
`D -> num_labels` projection (Hugging Face's `*ForSequenceClassification` layout), instead of the
vocabulary. `forward` returns per-position scores `[B,S,num_labels]`; the score of a sequence is
the one at its last real token (`sequence_scores`).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.modules.transformer import TransformerDecoder


def last_non_pad_index(tokens: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """`[B]` index of each row's rightmost token that is not `pad_id` (left or right padding), as
    transformers' `*ForSequenceClassification` picks it; the last position when `pad_id` is None."""
    b, s = tokens.shape
    if pad_id is None:
        return torch.full((b,), s - 1, dtype=torch.long, device=tokens.device)
    positions = torch.arange(s, device=tokens.device)
    return (positions * (tokens != pad_id).long()).argmax(-1)


def sequence_scores(scores: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`scores [B,S,L]` at `index [B]` -> `[B,L]`."""
    return scores[torch.arange(scores.shape[0], device=scores.device), index]


class ScoreDecoder(TransformerDecoder):
    """`TransformerDecoder` whose output projection is `score: Linear(D, num_labels, bias=False)`.

    Built from an existing decoder's modules (no copies) by `engine.models.reward.reward_model`.
    `forward(...) -> [B,S,num_labels]` (same arguments as the decoder's); `forward_hidden` and the KV
    cache are inherited. Never tied: `output_weight` is the `[num_labels, D]` score weight.
    """

    def __init__(self, decoder: TransformerDecoder, score: nn.Module) -> None:
        super().__init__(
            tok_embeddings=decoder.tok_embeddings,
            layers=list(decoder.layers),
            norm=decoder.norm,
            output=None,
            rope=decoder.rope,
            max_seq_len=decoder.max_seq_len,
            sliding_window=decoder.sliding_window,
        )
        self.score = score

    @property
    def num_labels(self) -> int:
        return int(self.output_weight.shape[0])

    @property
    def tied(self) -> bool:
        return False

    @property
    def output_weight(self) -> torch.Tensor:
        merged = getattr(self.score, "merged_weight", None)
        return merged() if callable(merged) else self.score.weight

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = self.forward_hidden(
            tokens, position_ids=position_ids, document_ids=document_ids, mask=mask, input_pos=input_pos
        )
        return self.score(h)  # [B,S,L]
