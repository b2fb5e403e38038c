"""`TunebenchLM`: the lm-evaluation-harness model (`--model tunebench`) for native decoders.

It scores requests the way lm-eval's `hf` backend does, so the two give the same numbers on the same
weights (tested), but runs the native decoder:

- `loglikelihood`: context + continuation in one sequence (context's trailing spaces moved to the
  continuation, lm-eval's rule), left-truncated to `max_length + 1` tokens, batches sorted longest
  first and right-padded (a causal model never sees the padding). Only the continuation positions
  are projected to the vocabulary (`forward_hidden` + `output_weight`), never `[B,S,V]`. Requests
  sharing a context whose continuation is one token reuse one forward (lm-eval's `Collator` cache).
- `loglikelihood_rolling`: lm-eval's disjoint rolling windows of `max_length` tokens, prefixed with
  `prefix_token_id` (BOS, else EOS), all windows of all documents batched together.
- `generate_until`: contexts left-truncated to `max_length - max_gen_toks`, batched, decoded with the
  KV cache (`engine.generation.generate`), each row stopping at an EOS id or once its text holds one
  of the request's `until` strings; the batch ends when every row has stopped.
- BOS: added when the tokenizer files add one on their own (`Tokenizer.file_adds_bos`, as the hf
  backend's tokenizer does; `add_bos_token` overrides), never doubled;
  `apply_chat_template` renders the tokenizer's chat template (`--apply_chat_template`).

Build it from a folder (`TunebenchLM(pretrained=DIR)`, what `--model_args pretrained=DIR` does) or
from a model already in memory (`TunebenchLM(model=..., tokenizer=...)`, used for periodic eval).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
    Collator,
    handle_stop_sequences,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from torch import nn
from tqdm import tqdm

from engine.eval.eval_errors import EvalError
from engine.eval.model_loading import (
    config_max_length,
    generation_eos_ids,
    load_eval_model,
    tokenizer_folder,
)

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "auto": None,
}


class _AllRowsStopped(Exception):
    """Raised from the generation step callback once every row has met a stop string or EOS."""


def _as_bool(value, field: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise EvalError(f"{field}: {value!r} is not a boolean; use true or false")


def _as_int(value, field: str, *, minimum: int = 1) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise EvalError(f"{field}: {value!r} is not an integer; give a number >= {minimum}") from None
    if number < minimum:
        raise EvalError(f"{field}: {number} is too small; give a number >= {minimum}")
    return number


@register_model("tunebench")
class TunebenchLM(TemplateLM):
    """lm-eval model for tunebench's native decoders.

    Args:
        pretrained: HF model folder or PEFT adapter folder (with `model`/`tokenizer`, leave None).
        model / tokenizer: an already built decoder and tunebench tokenizer (instead of `pretrained`).
        batch_size: requests per forward (int, default 8; lm-eval passes it as text; `auto` means 8).
        max_length: context length (default: the folder's config, as the `hf` backend; else the
            model's `max_seq_len`). max_gen_toks: default new-token budget for generation (256).
        dtype: float32 | bfloat16 | float16 (default float32 on CPU, bfloat16 on CUDA).
        device: cpu | cuda | auto (default auto). add_bos_token: force BOS on/off (default: the
            tokenizer's own rule). quantize_base: adapters only, keep the base in NF4.
        logits_cache: reuse one forward for one-token continuations of a shared context (default True).
        stop_ids: extra token ids that end a generation (EOS and generation_config's EOS ids always do).
    Raises:
        EvalError: a bad setting (names it). CheckpointError: an unreadable model folder.
    """

    backend = "causal"

    def __init__(
        self,
        pretrained: str | os.PathLike | None = None,
        *,
        model: nn.Module | None = None,
        tokenizer=None,
        batch_size: int | str | None = 8,
        max_batch_size: int | None = None,
        max_length: int | str | None = None,
        max_gen_toks: int | str = 256,
        dtype: str | torch.dtype | None = None,
        device: str | None = None,
        add_bos_token: bool | str | None = None,
        quantize_base: bool | str = False,
        logits_cache: bool | str = True,
        stop_ids: Sequence[int] = (),
        **unused,
    ) -> None:
        super().__init__()
        if unused:
            raise EvalError(
                f"model_args: unknown argument(s) {sorted(unused)} for the tunebench model; use pretrained, "
                "batch_size, max_length, max_gen_toks, dtype, device, add_bos_token, quantize_base, logits_cache"
            )
        if batch_size in (None, "auto") or str(batch_size).startswith("auto"):
            batch_size = 8
        self._batch_size = _as_int(batch_size, "batch_size")
        self._max_gen_toks = _as_int(max_gen_toks, "max_gen_toks")
        self.add_bos_token = _as_bool(add_bos_token, "add_bos_token")
        self.logits_cache = bool(_as_bool(logits_cache, "logits_cache"))
        device = (device or "auto").lower()
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise EvalError("device: cuda requested but no CUDA device is visible; use device=cpu")
        self._device = torch.device(device)
        if isinstance(dtype, str):
            if dtype.lower() not in _DTYPES:
                raise EvalError(f"dtype: unknown dtype {dtype!r}; use float32, bfloat16 or float16")
            dtype = _DTYPES[dtype.lower()]
        if dtype is None:
            dtype = torch.bfloat16 if self._device.type == "cuda" else torch.float32

        eos_ids: set[int] = set()
        if model is None:
            if pretrained is None:
                raise EvalError(
                    "model_args: give pretrained=<model folder> (or build with model= and tokenizer=)"
                )
            from engine.data.tokenizers import load_tokenizer

            folder = Path(pretrained).expanduser()
            self.model = load_eval_model(
                folder,
                dtype=dtype,
                device=self._device,
                quantize_base=bool(_as_bool(quantize_base, "quantize_base")),
            )
            self.tok = load_tokenizer(tokenizer_folder(folder))
            self._max_length = int(max_length) if max_length else config_max_length(folder)
            eos_ids = generation_eos_ids(folder)
            self._name = str(folder)
        else:
            if tokenizer is None:
                raise EvalError("tokenizer: an in-memory model needs its tokenizer; pass tokenizer=")
            self.model = model
            self.tok = tokenizer
            self._max_length = int(max_length) if max_length else int(getattr(model, "max_seq_len", 2048))
            self._name = type(model).__name__
        self.model.eval()
        if self.tok.eos_id is None:
            raise EvalError(
                f"{self._name}: the tokenizer names no EOS token; add eos_token to tokenizer_config.json"
            )
        self._stop_ids = {int(self.tok.eos_id), *eos_ids, *(int(i) for i in stop_ids)}
        model_len = getattr(self.model, "max_seq_len", None)
        if model_len is not None and self._max_length > model_len:
            self._max_length = int(model_len)

    # ---- properties lm-eval reads -------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return int(self.tok.eos_id)

    @property
    def prefix_token_id(self) -> int:
        return int(self.tok.bos_id) if self.tok.bos_id is not None else int(self.tok.eos_id)

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tok, "source", self._name)).replace("/", "__")

    # ---- tokenization ------------------------------------------------------------------------
    def tok_encode(
        self,
        string: str,
        add_special_tokens: bool | None = None,
        left_truncate_len: int | None = None,
        **kwargs,
    ) -> list[int]:
        """Token ids of `string`: BOS as the tokenizer adds it (or as `add_special_tokens` /
        `add_bos_token` say), none when the text already starts with the BOS string; no EOS."""
        add_bos = add_special_tokens if add_special_tokens is not None else self.add_bos_token
        if add_special_tokens is None and self.tok.bos_id is not None:
            if string.startswith(self.tok.decode([self.tok.bos_id], skip_special_tokens=False)):
                add_bos = False
        if add_bos is None:  # as lm-eval's hf backend: what the tokenizer files do on their own
            add_bos = getattr(self.tok, "file_adds_bos", True)
        ids = self.tok.encode(string, add_bos=add_bos, add_eos=False)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(tokens), skip_special_tokens=skip_special_tokens)

    # ---- scoring -------------------------------------------------------------------------------
    @torch.no_grad()
    def _continuation_logprobs(self, chunk) -> list[tuple[torch.Tensor, int]]:
        """One forward for a chunk of `(key, context_ids, continuation_ids)`: per request its
        log-probabilities over the vocabulary at the continuation positions `[1,C,V]` (float32)."""
        windows = [(ctx + cont)[-(self.max_length + 1) :][:-1] for _, ctx, cont in chunk]
        longest = max(len(w) for w in windows)
        tokens = torch.full((len(windows), longest), self.tok.pad_id, dtype=torch.long)  # [B,L] right-padded
        for row, window in enumerate(windows):
            tokens[row, : len(window)] = torch.tensor(window, dtype=torch.long)
        hidden = self.model.forward_hidden(tokens.to(self._device))  # [B,L,D]
        picked, spans = [], []
        for row, (window, (_, _, cont)) in enumerate(zip(windows, chunk)):
            n = len(cont)
            picked.append(hidden[row, len(window) - n : len(window)])  # [C,D]
            spans.append(n)
        logits = F.linear(torch.cat(picked), self.model.output_weight).float()  # [sum C, V]
        logprobs = torch.log_softmax(logits, dim=-1)
        return [(part.unsqueeze(0), n) for part, n in zip(logprobs.split(spans), spans)]

    def _loglikelihood_tokens(
        self, requests, disable_tqdm: bool = False, **kwargs
    ) -> list[tuple[float, bool]]:
        """`(sum log p(continuation | context), continuation is the greedy choice)` per request."""
        for _, ctx, cont in requests:
            if not ctx or not cont:
                raise EvalError(
                    "loglikelihood request with an empty context or continuation; check the task's doc_to_text/doc_to_choice"
                )
        order = Collator(
            requests,
            sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])),
            group_by="contexts" if self.logits_cache else None,
            group_fn=lambda r: r[-2] + r[-1][:-1],
        )
        results = []
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="tunebench loglikelihood")
        for chunk in order.get_batched(n=self.batch_size):
            for (key, ctx, cont), (logprobs, _) in zip(chunk, self._continuation_logprobs(chunk)):
                greedy = logprobs.argmax(dim=-1)  # [1,C]
                for key_i, cont_i, lp in order.get_cache(
                    req_str=key, cxt_toks=ctx, cont_toks=cont, logits=logprobs
                ):
                    target = torch.tensor(cont_i, dtype=torch.long, device=lp.device)[None]  # [1,C']
                    is_greedy = bool((greedy[:, -target.shape[1] :] == target).all())
                    score = float(lp[:, -target.shape[1] :].gather(2, target[..., None]).sum())
                    answer = (score, is_greedy)
                    results.append(answer)
                    if key_i is not None:
                        self.cache_hook.add_partial("loglikelihood", key_i, answer)
                    bar.update(1)
        bar.close()
        return order.get_original(results)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Total log-likelihood of each whole text, over disjoint windows of `max_length` tokens."""
        windows, owners = [], []
        for index, (text,) in enumerate(req.args for req in requests):
            for ctx, cont in map(
                make_disjoint_window,
                get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                ),
            ):
                windows.append((None, ctx, cont))
                owners.append(index)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm) if windows else []
        totals = [0.0] * len(requests)
        for owner, (score, _) in zip(owners, scores):
            totals[owner] += score
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ---- generation ----------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled, with `do_sample`) continuations, cut at the first `until` string."""
        from engine.generation import generate

        eos_text = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        order = Collator(
            [req.args for req in requests],
            sort_fn=lambda r: (-len(self.tok_encode(r[0])), r[0]),
            group_by="gen_kwargs",
            group_fn=lambda r: r[1],
        )
        results = []
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc="tunebench generate_until")
        for chunk in order.get_batched(n=self.batch_size):
            contexts, all_kwargs = zip(*chunk)
            kwargs = normalize_gen_kwargs(dict(all_kwargs[0]), self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
            max_new = int(kwargs.pop("max_gen_toks"))
            if max_new >= self.max_length:
                raise EvalError(
                    f"max_gen_toks: {max_new} leaves no room for the prompt in a context of {self.max_length}; lower it"
                )
            prompts = [self.tok_encode(c, left_truncate_len=self.max_length - max_new) for c in contexts]
            sample = bool(kwargs.get("do_sample")) and float(kwargs.get("temperature", 0.0)) > 0
            ids = self._generate_rows(
                generate,
                prompts,
                max_new,
                until,
                temperature=float(kwargs.get("temperature", 0.0)) if sample else 0.0,
                top_k=kwargs.get("top_k") if sample else None,
                top_p=kwargs.get("top_p") if sample else None,
            )
            for context, gen_kwargs, row in zip(contexts, all_kwargs, ids):
                text = postprocess_generated_text(self.tok_decode(row), stop=until, think_end_token=None)
                results.append(text)
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
                bar.update(1)
        bar.close()
        return order.get_original(results)

    def _generate_rows(self, generate, prompts, max_new, until, **sampling) -> list[list[int]]:
        """Generated ids per row (EOS ids dropped). A row stops at an EOS id or when its text (special
        tokens kept) contains an `until` string; generation ends once every row has stopped."""
        rows: list[list[int]] = [[] for _ in prompts]
        finished = [False] * len(prompts)
        stops = [s for s in until if s]

        def on_step(chosen: torch.Tensor, running: torch.Tensor) -> None:
            for r, (token, alive) in enumerate(zip(chosen.tolist(), running.tolist())):
                if not alive or finished[r]:
                    continue
                if token in self._stop_ids:
                    finished[r] = True
                    continue
                rows[r].append(token)
                if stops and any(s in self.tok_decode(rows[r], skip_special_tokens=False) for s in stops):
                    finished[r] = True
            if all(finished):
                raise _AllRowsStopped

        try:
            generate(
                self.model,
                prompts,
                max_new_tokens=max_new,
                stop_tokens=sorted(self._stop_ids),
                pad_id=self.tok.pad_id,
                on_step=on_step,
                **sampling,
            )
        except _AllRowsStopped:
            pass
        return rows

    # ---- chat templates ------------------------------------------------------------------------
    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The tokenizer's chat template text (None when disabled or absent)."""
        if chat_template is False or chat_template is None:
            return None
        return getattr(self.tok, "chat_template", None)

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """Render `chat_history` with the tokenizer's template. Without a generation prompt the last
        (assistant) message is left open, so the continuation extends it (lm-eval's prefill)."""
        text = self.tok.apply_chat_template(
            chat_history, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        if not add_generation_prompt and chat_history and chat_history[-1].get("role") == "assistant":
            content = chat_history[-1].get("content", "")
            cut = text.rfind(content)
            if content and cut >= 0:
                text = text[: cut + len(content)]
        return text
