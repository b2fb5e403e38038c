"""Batched autoregressive generation with the decoder's KV cache.

Prompts of different lengths are left-padded to the longest one `P`, so every row writes the same
cache slot at each step (the cache's `input_pos` is shared by all rows). Each row still gets its own
RoPE positions (`position_ids` count from its first real token) and an attention mask that hides its
padding slots, so a row's tokens are exactly those it would get alone. Rows stop independently at a
stop token and then leave the compute batch (their KV-cache rows are squeezed out); the loop ends
when every row has stopped or `max_new_tokens` are generated.

A LongRoPE model (`rope.scaling.recompute_cache_on_switch`) whose sequence grows past the schedule's
switch length during generation re-encodes the whole sequence at that step, so every cached key is
rotated by the long factors (what a recompute without cache gives; transformers' Phi-3 does the same).

Cache layout for `B` rows, `P` prompt slots and `T = max_new_tokens`: slots `0..P-1` hold the
(left-padded) prompts, slot `P + t` the token generated at step `t`; the cache has `P + T` slots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ConfigError
from engine.generation.sampling import sample_next_token


class GenerationError(ConfigError):
    """A generation setting or prompt that cannot be used; names the argument and what to change."""


@dataclass
class GenerationOutput:
    """What `generate` returns.

    tokens: `[B,T]` long, generated ids; after a row's stop token the row holds `pad_id`.
    lengths: `[B]` long, generated tokens per row, the stop token included.
    stopped: `[B]` bool, whether the row ended on a stop token (else it hit `max_new_tokens`).
    logprobs: `[B,T]` float32 log-probabilities of the chosen tokens under the tempered
      distribution (before top-k/top-p), `0` on padding; present with `return_logprobs=True`.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    stopped: torch.Tensor
    logprobs: torch.Tensor | None = None

    @property
    def completions(self) -> list[list[int]]:
        """Per row, the generated ids up to and including its stop token."""
        return [row[:n] for row, n in zip(self.tokens.tolist(), self.lengths.tolist())]


def _check(prompts, max_new_tokens, temperature, top_k, top_p, max_seq_len) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise GenerationError("prompts: every prompt needs at least one token; drop empty prompts")
    if max_new_tokens < 1:
        raise GenerationError(f"max_new_tokens: must be at least 1, got {max_new_tokens}")
    if temperature < 0:
        raise GenerationError(f"temperature: must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise GenerationError(f"top_k: must be a positive integer or None, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise GenerationError(f"top_p: must be in (0, 1], got {top_p}")
    longest = max(len(p) for p in prompts)
    if max_seq_len is not None and longest + max_new_tokens > max_seq_len:
        raise GenerationError(
            f"max_new_tokens: prompt ({longest} tokens) + {max_new_tokens} new tokens exceed the model's "
            f"max_seq_len {max_seq_len}; lower max_new_tokens or shorten the prompt"
        )


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """`[B,P]` left-padded prompt ids and `[B]` number of pad slots per row."""
    longest = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), longest), pad_id, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        tokens[row, longest - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long, device=device)
    pad_len = torch.tensor([longest - len(p) for p in prompts], dtype=torch.long, device=device)
    return tokens, pad_len


def _is_fsdp(model: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch built without distributed
        return False
    return isinstance(model, FSDPModule)


def _last_logits(model: nn.Module, tokens: torch.Tensor, **kwargs) -> torch.Tensor:
    """Logits of the last position only, `[B,V]` float32, without projecting the whole sequence.

    An FSDP2 model gathers its root parameters (embeddings, final norm, output) in `forward`'s hooks,
    so it goes through `forward` (all positions projected) instead of `forward_hidden`.
    """
    if _is_fsdp(model):
        return model(tokens, **kwargs)[:, -1].float()  # [B,V]
    hidden = model.forward_hidden(tokens, **kwargs)[:, -1]  # [B,D]
    return F.linear(hidden, model.output_weight).float()  # [B,V]


@torch.no_grad()
def generate(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_tokens: Sequence[int] = (),
    pad_id: int = 0,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    return_logprobs: bool = False,
    on_step: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> GenerationOutput:
    """Continue each prompt (a list of token ids) by up to `max_new_tokens` tokens.

    Args:
      model: a `TransformerDecoder` (`forward_hidden`, `output_weight`, `setup_caches`).
      temperature: 0 (default) is greedy; > 0 samples, optionally restricted by `top_k` / `top_p`.
      stop_tokens: ids that end a row (kept in its completion), e.g. `tokenizer.stop_tokens`.
      pad_id: fills left padding and the slots after a row's stop token.
      seed / generator: the random source for sampling (`generator` wins); default: torch's global RNG.
      use_cache: False recomputes the whole sequence each step (a reference path; same results).
      return_logprobs: also return the chosen tokens' log-probabilities.
      on_step: called after every step with the step's tokens `[B]` and the rows still running before
        it `[B]` bool (for streaming output).
      should_stop: asked after every step (after `on_step`); True ends generation there, keeping the
        tokens so far (those rows are not `stopped`). A UI's stop key sets a flag this reads.
    The model runs in eval mode during the call (its mode is restored) and any KV caches it had are
    replaced by caches sized for this call and removed afterwards.
    Raises `GenerationError` for empty prompts or bad settings (naming the argument).
    """
    _check(prompts, max_new_tokens, temperature, top_k, top_p, getattr(model, "max_seq_len", None))
    device = model.output_weight.device
    if generator is None and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    tokens, pad_len = left_pad(prompts, pad_id, device)  # [B,P], [B]
    batch, prompt_slots = tokens.shape
    total = prompt_slots + max_new_tokens
    slots = torch.arange(total, device=device)
    key_valid = slots[None, :] >= pad_len[:, None]  # [B,L]: False on each row's left padding
    prompt_len = prompt_slots - pad_len  # [B]
    stops = torch.tensor(sorted(set(stop_tokens)), dtype=torch.long, device=device)

    out = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = (
        torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device) if return_logprobs else None
    )
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)

    was_training = model.training
    model.eval()
    if use_cache:
        model.setup_caches(batch, total)
    try:
        # Prefill: queries are prompt slots 0..P-1. A padding query attends to itself only (no NaN rows).
        q = slots[:prompt_slots]
        causal = q[:, None] >= slots[None, :]  # [P,L]
        mask = (causal[None] & key_valid[:, None, :]) | (q[:, None] == slots[None, :])[None]  # [B,P,L]
        positions = (q[None, :] - pad_len[:, None]).clamp(min=0)  # [B,P]
        if use_cache:
            # Repeated prompts (GRPO groups: G samples per prompt) are prefilled once; their cache rows
            # are then copied to every row that shares them.
            first, inverse = _unique_rows(prompts, device)
            if first.numel() < batch:
                logits = _last_logits(
                    model, tokens[first], position_ids=positions[first], mask=mask[first], input_pos=q
                )[inverse]
                _expand_caches(model, inverse)
            else:
                logits = _last_logits(model, tokens, position_ids=positions, mask=mask, input_pos=q)
        else:
            logits = _last_logits(model, tokens, position_ids=positions, mask=mask[:, :, :prompt_slots])
        seq = tokens
        # Rows in the compute batch (original indices, in KV-cache row order). With the cache, rows that
        # stopped leave the batch: their cache rows are squeezed out, so late steps cost only the rows
        # still generating (GRPO rollouts vary a lot in length).
        active = torch.arange(batch, device=device)
        switch = _cache_switch_len(model) if use_cache else None
        switched = switch is None or int(prompt_len.max()) > switch
        for step in range(max_new_tokens):
            picked_ids = sample_next_token(
                logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
            )  # [n]
            was_done = done[active]
            picked_ids = torch.where(was_done, torch.full_like(picked_ids, pad_id), picked_ids)
            out[active, step] = picked_ids
            if logprobs is not None:
                scaled = logits / (temperature if temperature > 0 else 1.0)
                picked = torch.log_softmax(scaled, dim=-1).gather(-1, picked_ids[:, None]).squeeze(-1)
                logprobs[active, step] = torch.where(was_done, torch.zeros_like(picked), picked)
            if on_step is not None:
                on_step(out[:, step], ~done)
            lengths[active] += (~was_done).long()
            done[active] = was_done | torch.isin(picked_ids, stops)
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            if should_stop is not None and should_stop():
                break
            slot = prompt_slots + step
            if use_cache:
                running = ~done[active]
                if not bool(running.all()):
                    keep = running.nonzero().squeeze(1)
                    _compact_caches(model, keep)
                    active, picked_ids = active[keep], picked_ids[keep]
                positions = (prompt_len[active] + step)[:, None]  # [n,1]
                if not switched and int(positions.max()) + 1 > switch:
                    switched = True  # re-encode slots 0..slot with the long schedule
                    q = slots[: slot + 1]
                    seq = torch.cat([tokens[active], out[active, : step + 1]], dim=1)  # [n,slot+1]
                    valid = key_valid[active]
                    full = ((q[:, None] >= slots[None, :])[None] & valid[:, None, :]) | (
                        q[:, None] == slots[None, :]
                    )[None]
                    full_pos = (q[None, :] - pad_len[active][:, None]).clamp(min=0)  # [n,slot+1]
                    logits = _last_logits(model, seq, position_ids=full_pos, mask=full, input_pos=q)
                    continue
                step_mask = (slots[None, :] <= slot) & key_valid[active]  # [n,L]
                logits = _last_logits(
                    model,
                    picked_ids[:, None],
                    position_ids=positions,
                    mask=step_mask[:, None, :],
                    input_pos=slots[slot : slot + 1],
                )
            else:
                seq = torch.cat([seq, picked_ids[:, None]], dim=1)  # [B,slot+1]
                s = seq.shape[1]
                full_mask = mask_for_prefix(key_valid[:, :s])  # [B,s,s]
                full_pos = (slots[None, :s] - pad_len[:, None]).clamp(min=0)
                logits = _last_logits(model, seq, position_ids=full_pos, mask=full_mask)
    finally:
        if use_cache:
            model.teardown_caches()
        model.train(was_training)
    steps = int(lengths.max())
    return GenerationOutput(
        tokens=out[:, :steps],
        lengths=lengths,
        stopped=done,
        logprobs=None if logprobs is None else logprobs[:, :steps],
    )


def _cache_switch_len(model: nn.Module) -> int | None:
    """The length past which cached keys must be re-encoded (LongRoPE), or None."""
    scaling = getattr(getattr(model, "rope", None), "scaling", None)
    if getattr(scaling, "recompute_cache_on_switch", False):
        return scaling.switch_len
    return None


def _unique_rows(prompts: Sequence[Sequence[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """`first [U]`: index of the first row of each distinct prompt; `inverse [B]`: each row's distinct prompt."""
    seen: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    inverse: list[int] = []
    for row, prompt in enumerate(prompts):
        key = tuple(prompt)
        if key not in seen:
            seen[key] = len(first)
            first.append(row)
        inverse.append(seen[key])
    return torch.tensor(first, device=device), torch.tensor(inverse, device=device)


def _expand_caches(model: nn.Module, inverse: torch.Tensor) -> None:
    """Cache rows `0..U-1` (one per distinct prompt) -> rows `0..B-1`, row b taking `inverse[b]`."""
    b = inverse.numel()
    for layer in model.layers:
        cache = layer.attn.kv_cache
        cache.k_cache[:b] = cache.k_cache.index_select(0, inverse)
        cache.v_cache[:b] = cache.v_cache.index_select(0, inverse)


def _compact_caches(model: nn.Module, keep: torch.Tensor) -> None:
    """Move the KV-cache rows `keep` (`[n]` long, increasing) to rows `0..n-1` in every layer; the cache
    then serves a batch of `n` (`KVCache.update` uses the first `batch` rows)."""
    n = keep.numel()
    for layer in model.layers:
        cache = layer.attn.kv_cache
        cache.k_cache[:n] = cache.k_cache.index_select(0, keep)
        cache.v_cache[:n] = cache.v_cache.index_select(0, keep)


def mask_for_prefix(key_valid: torch.Tensor) -> torch.Tensor:
    """Causal mask over `S` slots that hides each row's padding; padding queries see themselves.
    `key_valid`: `[B,S]` bool -> `[B,S,S]` bool."""
    s = key_valid.shape[1]
    idx = torch.arange(s, device=key_valid.device)
    causal = idx[:, None] >= idx[None, :]  # [S,S]
    return (causal[None] & key_valid[:, None, :]) | torch.eye(s, dtype=torch.bool, device=key_valid.device)[
        None
    ]
