"""Linear cross-entropy: the output projection fused with the loss, in chunks of tokens.

`logits = hidden @ weight.T` followed by cross-entropy needs `[N, V]` logits in forward and the same
again for their gradient in backward: at V = 151,936 and 4,096 tokens that is 2.5 GB each in fp32.
Here the tokens whose label is `ignore_index` are dropped first (prompt tokens and padding never
reach the projection), then the kept tokens go through the projection `chunk_size` rows at a time.
Each chunk's gradient with respect to its logits, `softmax - one_hot`, is known as soon as its
loss is, so forward also produces `d loss / d hidden` and accumulates `d loss / d weight`; backward
only scales them by the incoming gradient. No chunk's logits outlive its loop iteration, so the
peak is one `[chunk_size, V]` fp32 block plus `[V, D]` for the weight gradient.

Trade-off: when gradients are needed, forward does the work of backward too (three matmuls per
chunk, as the unfused path); under `torch.no_grad()` only the loss is computed.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from engine.config import ConfigError
from engine.modules.loss.cross_entropy import check_reduction


class _ChunkedLinearCE(torch.autograd.Function):
    """Sum of token losses of `hidden @ weight.T` against `targets`, gradients computed in forward."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int, need_grad: bool):
        # hidden [N, D], weight [V, D], targets [N] (no ignored tokens left)
        num_tokens = hidden.shape[0]
        per_token = torch.empty(num_tokens, dtype=torch.float32, device=hidden.device)  # [N]
        grad_hidden = torch.empty_like(hidden) if need_grad else None  # [N, D]
        # [V, D] fp32 accumulator (bf16 sums over many chunks would lose precision), made by the first
        # chunk's product rather than zero-filled and added to
        grad_weight = None
        for start in range(0, num_tokens, chunk_size):
            end = min(start + chunk_size, num_tokens)
            h = hidden[start:end]  # [n, D]
            t = targets[start:end]  # [n]
            logits = (h @ weight.t()).float()  # [n, V] fp32
            rows = torch.arange(end - start, device=hidden.device)
            target_logit = logits[rows, t]  # [n], read before the block is overwritten
            # log-sum-exp done in place (no second [n, V] buffer): the block becomes exp(logits - max)
            row_max = logits.amax(dim=-1, keepdim=True)  # [n, 1]
            exps = logits.sub_(row_max).exp_()  # [n, V]
            sum_exp = exps.sum(dim=-1, keepdim=True)  # [n, 1]
            per_token[start:end] = (row_max + sum_exp.log()).squeeze(1) - target_logit
            if need_grad:
                # -> softmax - one_hot, in place: [n, V] = d(sum of losses) / d logits
                probs = exps.div_(sum_exp)
                probs[rows, t] -= 1.0
                d_logits = probs.to(hidden.dtype)  # [n, V]
                grad_hidden[start:end] = d_logits @ weight  # [n, D]
                if grad_weight is None:
                    grad_weight = (d_logits.t() @ h).float()  # [V, D] = [V, n] @ [n, D]
                elif weight.dtype == torch.float32:
                    grad_weight.addmm_(d_logits.t(), h)  # [V, D] += [V, n] @ [n, D]
                else:
                    grad_weight.add_(d_logits.t() @ h)
            del logits, exps
        if need_grad:
            if grad_weight is None:  # no token left to learn from: zero gradients
                grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        ctx.backward_done = False
        ctx.mark_non_differentiable(per_token)
        return per_token.sum(), per_token

    @staticmethod
    def backward(ctx, grad_total: Tensor, _grad_per_token: Tensor):
        if ctx.backward_done:
            raise RuntimeError(
                "LinearCrossEntropyLoss supports one backward per forward (no retain_graph reuse)"
            )
        ctx.backward_done = True
        grad_hidden, grad_weight = ctx.saved_tensors
        grad_h = grad_w = None
        # In place: a second [V, D] buffer at the end of backward would raise the peak for nothing.
        if ctx.needs_input_grad[0]:
            grad_h = grad_hidden.mul_(grad_total.to(grad_hidden.dtype))
        if ctx.needs_input_grad[1]:
            grad_w = grad_weight.mul_(grad_total).to(ctx.weight_dtype)
        return grad_h, grad_w, None, None, None


class LinearCrossEntropyLoss(nn.Module):
    """Cross-entropy of `hidden @ weight.T` without materialising the `[B, S, V]` logits.

    Args:
        num_chunks (int | None): split the kept tokens into this many chunks.
        chunk_size (int | None): tokens per chunk (the `[chunk_size, V]` fp32 block is the peak).
            Give at most one of the two; default `chunk_size=1024`.
        ignore_index (int): label value excluded from the loss; default -100.
        reduction (str): `mean` over non-ignored tokens (0, with zero gradients, when every token is
            ignored), or `sum` (for gradient accumulation, see `engine.training.grad_accumulation`).

    Raises:
        ConfigError: both or a non-positive chunk option, or a reduction other than `mean`/`sum`
            (per-token values come from `return_per_token=True`).
    """

    def __init__(
        self,
        num_chunks: int | None = None,
        chunk_size: int | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
    ):
        super().__init__()
        if num_chunks is not None and chunk_size is not None:
            raise ConfigError(
                "both num_chunks and chunk_size are set", hint="give only one of them", field="loss"
            )
        for name, value in (("num_chunks", num_chunks), ("chunk_size", chunk_size)):
            if value is not None and int(value) < 1:
                raise ConfigError(f"must be >= 1, got {value}", field=f"loss.{name}")
        if num_chunks is None and chunk_size is None:
            chunk_size = 1024
        if check_reduction(reduction) == "none":
            raise ConfigError(
                "'none' is not supported by linear cross-entropy",
                hint="use 'mean' or 'sum' and call the loss with return_per_token=True for per-token values",
                field="loss.reduction",
            )
        self.num_chunks = num_chunks
        self.chunk_size = chunk_size
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(
        self, hidden: Tensor, weight: Tensor, labels: Tensor, *, return_per_token: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Loss of the projection `hidden @ weight.T` against `labels`.

        Args:
            hidden: `[B, S, D]` final-normed hidden states (`model.forward_hidden(...)`).
            weight: `[V, D]` output projection (`model.output_weight`).
            labels: `[B, S]` long, already shifted; `ignore_index` marks tokens outside the loss.
            return_per_token: also return detached per-token losses `[B, S]` fp32 (0 where ignored),
                e.g. for loss per data source.

        Returns:
            The scalar loss (fp32), or `(loss, per_token)`.
        """
        batch, seq, dim = hidden.shape
        flat_labels = labels.reshape(-1)  # [B * S]
        keep = (flat_labels != self.ignore_index).nonzero().squeeze(1)  # [N] indices of kept tokens
        kept_hidden = hidden.reshape(-1, dim).index_select(0, keep)  # [N, D]
        targets = flat_labels.index_select(0, keep)  # [N]
        num_tokens = keep.numel()
        if self.chunk_size is not None:
            chunk = self.chunk_size
        else:
            chunk = max(1, -(-num_tokens // self.num_chunks))
        need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
        total, per_kept = _ChunkedLinearCE.apply(kept_hidden, weight, targets, chunk, need_grad)
        loss = total / max(num_tokens, 1) if self.reduction == "mean" else total
        if not return_per_token:
            return loss
        per_token = torch.zeros(batch * seq, dtype=torch.float32, device=hidden.device)
        per_token[keep] = per_kept
        return loss, per_token.view(batch, seq)
