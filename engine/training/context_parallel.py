"""Context parallelism: every sequence split over the cp ranks, attention as a causal ring.

Load balancing: a sequence of S tokens is cut into `2 * cp` chunks and rank r keeps chunks r and
`2cp - 1 - r` (`split_batch`), so under the causal mask every rank has the same amount of work
(the early chunk sees little, the late one much). Ring attention: each rank keeps its queries and
passes its keys/values around the ring (send to the next rank, receive from the previous one, the
transfer of step t+1 overlapping the compute of step t); the partial results of each key block are
merged with their log-sum-exp (online softmax), so no rank holds more than `[S/cp, S/cp]` scores.
The backward runs the ring again: each rank accumulates dQ for its queries while dK/dV travel with
their block and arrive back at their owner after a full turn.

The mask of a query/key pair follows from their global positions and documents (same document and
key position <= query position, within the sliding window if any), so packed batches are supported:
`split_batch` keeps `position_ids` (restarting per document) and `document_ids` with each slice.
Padding added to make S a multiple of `2 * cp` (and of tp under sequence parallelism) forms its own
document with ignored labels. With `compile`, each block is compiled in two graphs, before and after
the ring, which runs eagerly (`torch.compiler.disable`). torch's `context_parallel` API is not used: its CPU/gloo path does not
cover the SDPA CPU kernel and it cannot express packed documents.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from engine.modules.attention_masks import AttentionSpec

IGNORE_INDEX = -100
PAD_DOCUMENT = -1


# ---- batches -----------------------------------------------------------------------------------
def pad_batch(batch: dict[str, torch.Tensor], multiple: int, *, pad_id: int) -> dict[str, torch.Tensor]:
    """Pad every `[B,S]` tensor of a batch to a sequence length that is a multiple of `multiple`:
    tokens `pad_id`, labels ignored, positions continuing, padding its own document. The padding comes
    last and is causal, so it changes no other token's attention or loss."""
    tokens = batch["tokens"]
    b, s = tokens.shape
    extra = -s % multiple
    if not extra:
        return dict(batch)
    fill = {"tokens": pad_id, "labels": IGNORE_INDEX, "document_ids": PAD_DOCUMENT, "source_ids": -1}
    out = {}
    for key, value in batch.items():
        if torch.is_tensor(value) and value.dim() == 2 and value.shape[1] == s:
            if key == "position_ids":
                tail = value[:, -1:] + torch.arange(1, extra + 1, device=value.device)
            else:
                tail = torch.full((b, extra), fill.get(key, 0), dtype=value.dtype, device=value.device)
            value = torch.cat([value.expand(b, s), tail], dim=1)
        out[key] = value
    return out


def chunk_indices(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """The sequence positions rank `cp_rank` keeps: chunks `cp_rank` and `2cp - 1 - cp_rank` of `2cp`."""
    if seq_len % (2 * cp):
        raise ValueError(
            f"context parallelism: sequence length {seq_len} is not a multiple of 2 x cp = {2 * cp}"
        )
    c = seq_len // (2 * cp)
    first = torch.arange(cp_rank * c, (cp_rank + 1) * c)
    second = torch.arange((2 * cp - 1 - cp_rank) * c, (2 * cp - cp_rank) * c)
    return torch.cat([first, second])


def split_batch(
    batch: dict[str, torch.Tensor], cp: int, cp_rank: int, *, pad_id: int, multiple: int = 1
) -> dict:
    """This cp rank's load-balanced slice of every `[B,S]` tensor of a batch, with the global
    `position_ids` the slice needs (padded first to a multiple of `2 * cp * multiple`; `multiple` =
    tp under sequence parallelism)."""
    tokens = batch["tokens"]
    if "position_ids" not in batch:
        b, s = tokens.shape
        batch = {**batch, "position_ids": torch.arange(s, device=tokens.device).expand(b, s)}
    batch = pad_batch(batch, 2 * cp * multiple, pad_id=pad_id)
    s = batch["tokens"].shape[1]
    idx = chunk_indices(s, cp, cp_rank).to(tokens.device)
    return {
        k: v.index_select(1, idx) if torch.is_tensor(v) and v.dim() == 2 and v.shape[1] == s else v
        for k, v in batch.items()
    }


# ---- the ring ----------------------------------------------------------------------------------
def _shift(tensors: list[torch.Tensor], group, send_to: int, recv_from: int) -> tuple[list, list]:
    """Start sending `tensors` to the next rank and receiving the previous rank's; returns (buffers, works)."""
    buffers = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), send_to, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, buf, recv_from, group) for buf in buffers]
    return buffers, dist.batch_isend_irecv(ops)


def _block_scores(q, k, allowed, scale):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # [B,H,Sq,Sk]
    return s.masked_fill(~allowed[:, None], float("-inf"))


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, masks, group, scale):
        # q, k, v: [B,H,Sl,hd] (kv heads already expanded); masks[j]: [B,Sl,Sl] for key block of rank j.
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        nxt, prv = dist.get_global_rank(group, (rank + 1) % cp), dist.get_global_rank(group, (rank - 1) % cp)
        qf = q.float()
        out = torch.zeros_like(qf)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)  # [B,H,Sl]
        kv = [k, v]
        for step in range(cp):
            works = None
            if step < cp - 1:
                incoming, works = _shift(kv, group, nxt, prv)
            src = (rank - step) % cp
            allowed = masks[src]
            if bool(allowed.any()):
                scores = _block_scores(qf, kv[0].float(), allowed, scale)
                block_lse = torch.logsumexp(scores, dim=-1)  # [B,H,Sl], -inf where a row sees nothing
                safe = torch.where(torch.isfinite(block_lse), block_lse, torch.zeros_like(block_lse))
                block_out = torch.matmul((scores - safe[..., None]).exp(), kv[1].float())
                new_lse = torch.logaddexp(lse, block_lse)
                new_safe = torch.where(torch.isfinite(new_lse), new_lse, torch.zeros_like(new_lse))
                out = (
                    out * (lse - new_safe).exp()[..., None]
                    + block_out * (block_lse - new_safe).exp()[..., None]
                )
                lse = new_lse
            if works is not None:
                for w in works:
                    w.wait()
                kv = incoming
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.masks, ctx.group, ctx.scale = masks, group, scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        masks, group, scale = ctx.masks, ctx.group, ctx.scale
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        nxt, prv = dist.get_global_rank(group, (rank + 1) % cp), dist.get_global_rank(group, (rank - 1) % cp)
        qf, do = q.float(), dout.float()
        delta = (do * out).sum(-1, keepdim=True)  # [B,H,Sl,1]
        dq = torch.zeros_like(qf)
        block = [k, v, torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)]
        for step in range(cp):
            src = (rank - step) % cp
            allowed = masks[src]
            kb, vb, dk, dv = block
            if bool(allowed.any()):
                scores = _block_scores(qf, kb.float(), allowed, scale)
                p = (scores - lse[..., None]).exp()  # [B,H,Sl,Sk]; 0 where masked
                dv = dv + torch.matmul(p.transpose(-1, -2), do)
                ds = p * (torch.matmul(do, vb.float().transpose(-1, -2)) - delta)
                dq = dq + torch.matmul(ds, kb.float()) * scale
                dk = dk + torch.matmul(ds.transpose(-1, -2), qf) * scale
            # Pass the block on with its gradients; after the last step only dK/dV travel (home).
            send = [kb, vb, dk, dv] if step < cp - 1 else [dk, dv]
            incoming, works = _shift(send, group, nxt, prv)
            for w in works:
                w.wait()
            block = incoming if step < cp - 1 else [None, None, *incoming]
        dk, dv = block[2], block[3]
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


class RingMask(AttentionSpec):
    """This rank's queries against every cp rank's keys; `masks[j]` `[B,Sl,Sl]` for rank j's block."""

    def __init__(self, masks: list[torch.Tensor], group) -> None:
        self.masks, self.group = masks, group

    # Under `compile=true` the ring runs eagerly between the block's compiled graphs: its send/recv
    # and data-dependent skips of empty blocks are a graph break, not something to trace.
    @torch.compiler.disable
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float) -> torch.Tensor:
        if dropout_p > 0.0:
            raise ValueError(
                "context parallelism: ring attention has no attention dropout — set attn_dropout=0"
            )
        if k.shape[1] != q.shape[1]:  # GQA: each query head's key/value head (autograd sums back)
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        return _RingAttention.apply(q, k, v, self.masks, self.group, 1.0 / math.sqrt(q.shape[-1]))


class ContextParallel:
    """The decoder's context-parallel state (`model.context_parallel`, set by `parallelize`).

    Args:
        group: the cp process group (`mesh["cp"].get_group()`).
    """

    def __init__(self, group) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def mask(
        self, position_ids: torch.Tensor, document_ids: torch.Tensor | None, sliding_window: int | None
    ) -> RingMask:
        """The ring mask of one forward: positions/documents of every rank's slice gathered once
        (small integers), one `[B,Sl,Sl]` bool mask per key block, shared by all layers."""
        b, sl = position_ids.shape[0], position_ids.shape[-1]
        pos = position_ids.expand(b, sl).contiguous()
        doc = torch.zeros_like(pos) if document_ids is None else document_ids.contiguous()
        meta = torch.stack([pos, doc])  # [2,B,Sl]
        gathered = [torch.empty_like(meta) for _ in range(self.size)]
        dist.all_gather(gathered, meta, group=self.group)
        masks = []
        for other in gathered:
            k_pos, k_doc = other[0], other[1]
            allowed = (doc[:, :, None] == k_doc[:, None, :]) & (k_pos[:, None, :] <= pos[:, :, None])
            if sliding_window is not None:
                allowed &= pos[:, :, None] - k_pos[:, None, :] < sliding_window
            masks.append(allowed)
        return RingMask(masks, self.group)
