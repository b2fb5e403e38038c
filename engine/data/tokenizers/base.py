"""The tokenizer interface every backend shares (see docs/ARCHITECTURE.md, "Tokenizers and data").

A backend (tokenizer.json, SentencePiece, tiktoken) implements five primitives: `_encode_plain`,
`_decode`, `token_to_id`, `id_to_token` and `vocab_size`. This base turns them into the interface
the data pipeline and generation use: BOS/EOS handling, `pad_id`, `stop_tokens` and the chat template.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from engine.data.tokenizers.chat_template import render_chat_template
from engine.data.tokenizers.hf_side_files import TokenizerFiles
from engine.data.tokenizers.tokenizer_errors import TokenizerError

# End-of-turn / end-of-text tokens that stop generation when a vocabulary has them.
END_OF_TURN_TOKENS = ("<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
# Dedicated padding tokens, preferred over reusing EOS when the config names no pad token.
PAD_TOKENS = ("<|finetune_right_pad_id|>", "<pad>", "<|pad|>", "[PAD]")


class Tokenizer(ABC):
    """Text <-> token ids, special tokens by name, and the model's chat template.

    Attributes set by `_setup_specials` (call it at the end of a backend's `__init__`):
      `bos_id`, `eos_id`, `pad_id`, `unk_id` (int | None; `pad_id` is always an int),
      `stop_tokens` (list[int]), `adds_bos` (bool: `encode(add_bos=True)` prepends BOS),
      `file_adds_bos` (bool: whether the tokenizer files prepend BOS on their own, as transformers'
      tokenizer does; differs from `adds_bos` only where tunebench follows the model's reference
      layout instead, e.g. a Llama 3 `tokenizer.json` without the BOS post-processor),
      `chat_template` (str | None).
    """

    bos_id: int | None
    eos_id: int | None
    pad_id: int
    unk_id: int | None
    stop_tokens: list[int]
    adds_bos: bool
    file_adds_bos: bool
    chat_template: str | None
    source: str

    # ---- backend primitives -------------------------------------------------------------------------
    @abstractmethod
    def _encode_plain(self, text: str) -> list[int]:
        """Ids of `text` without BOS/EOS; special-token strings in `text` map to their ids."""

    @abstractmethod
    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        """Text of `ids`."""

    @abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """Id of the token string `token` (e.g. ``"<|im_end|>"``), ``None`` if not in the vocabulary."""

    @abstractmethod
    def id_to_token(self, token_id: int) -> str | None:
        """Token string of `token_id`, ``None`` if out of range."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, added/special tokens included."""

    # ---- shared behaviour ---------------------------------------------------------------------------
    def _setup_specials(
        self,
        files: TokenizerFiles,
        *,
        bos: str | None,
        eos: str | None,
        pad: str | None = None,
        unk: str | None = None,
        adds_bos: bool,
        file_adds_bos: bool | None = None,
    ) -> None:
        """Resolve special-token strings (side files win over backend defaults) to ids."""
        self.bos_id = self._id_or_none(files.bos_token or bos)
        self.eos_id = self._id_or_none(files.eos_token or eos)
        self.unk_id = self._id_or_none(files.unk_token or unk)
        pad_id = self._id_or_none(files.pad_token or pad)
        if pad_id is None:
            pad_id = next((i for i in map(self._id_or_none, PAD_TOKENS) if i is not None), None)
        if pad_id is None:
            pad_id = self.eos_id if self.eos_id is not None else 0
        self.pad_id = pad_id
        flag = files.add_bos_token
        self.adds_bos = self.bos_id is not None and (adds_bos if flag is None else flag)
        own = adds_bos if file_adds_bos is None else file_adds_bos
        self.file_adds_bos = self.bos_id is not None and (own if flag is None else flag)
        stops: list[int] = []
        for i in [self.eos_id, *files.generation_eos_ids, *map(self._id_or_none, END_OF_TURN_TOKENS)]:
            if i is not None and i not in stops:
                stops.append(i)
        self.stop_tokens = stops
        self.chat_template = files.chat_template

    def _id_or_none(self, token: str | None) -> int | None:
        return None if token is None else self.token_to_id(token)

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        """Token ids of `text`.

        `add_bos` prepends BOS when this model's tokenizer uses one (`adds_bos`: Llama and Mistral do,
        Qwen and SmolLM2 do not); `add_eos` appends `eos_id`. Special-token strings inside `text`
        (e.g. ``"<|im_start|>"``) become their ids, so rendered chat templates encode correctly.
        """
        ids = self._encode_plain(text)
        if add_bos and self.adds_bos and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        if add_eos and self.eos_id is not None:
            ids = [*ids, self.eos_id]
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Text of `ids` (a list of ints or a 1-D tensor); special tokens dropped unless asked."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return self._decode([int(i) for i in ids], skip_special_tokens)

    def special_tokens(self) -> dict[str, int]:
        """Named special tokens: ``{"bos": id, "eos": id, "pad": id, ...}`` (only those that exist)."""
        named = {"bos": self.bos_id, "eos": self.eos_id, "pad": self.pad_id, "unk": self.unk_id}
        return {k: v for k, v in named.items() if v is not None}

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        chat_template: str | None = None,
        **extra: Any,
    ) -> str | list[int]:
        """Render `messages` with the model's chat template (or `chat_template`).

        Returns the string, or its ids with `tokenize=True` (encoded without adding BOS/EOS, since
        templates write their own). `extra` reaches the template (e.g. ``enable_thinking=False``).
        Raises `TokenizerError` when there is no template, `ChatTemplateError` when it fails.
        """
        source = chat_template or self.chat_template
        if source is None:
            raise TokenizerError(
                f"{self.source}: no chat template (add `chat_template` to tokenizer_config.json, "
                "or use one of tunebench's chat formats)"
            )

        def name(i: int | None) -> str | None:
            return None if i is None else self.id_to_token(i)

        text = render_chat_template(
            source,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens={
                "bos_token": name(self.bos_id),
                "eos_token": name(self.eos_id),
                "pad_token": name(self.pad_id),
                "unk_token": name(self.unk_id),
            },
            **extra,
        )
        if tokenize:
            return self.encode(text, add_bos=False, add_eos=False)
        return text

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(source={self.source!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, pad_id={self.pad_id})"
        )
