"""Tokenizer from a tiktoken BPE file (Llama 3's original `tokenizer.model`, OpenAI `.tiktoken` files).

The file lists one token per line: the token's bytes in base64, a space, its rank (= its id).
Special tokens are not in the file: they come from `tokenizer_config.json`'s `added_tokens_decoder`
when present, else from the Llama 3 layout (256 special ids after the BPE ranks).
"""

from __future__ import annotations

import base64
import binascii
import weakref
from pathlib import Path

from engine.data.tokenizers.base import Tokenizer
from engine.data.tokenizers.hf_side_files import TokenizerFiles, read_tokenizer_files
from engine.data.tokenizers.rank_bpe import EncodingSpec
from engine.data.tokenizers.threaded_encode import EncodeHelpers, encode_chunks, resolve_threads
from engine.data.tokenizers.tokenizer_errors import TokenizerError

# Llama 3's pre-tokenizer split: contractions, letter runs, 1-3 digit groups, punctuation, newlines, spaces.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_NUM_SPECIAL = 256
_LLAMA3_NAMED = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]


def llama3_special_tokens(num_ranks: int) -> dict[str, int]:
    """Llama 3.1+ special tokens: the named ones, then reserved ones up to 256 ids after the ranks."""
    names = list(_LLAMA3_NAMED)
    names += [f"<|reserved_special_token_{i}|>" for i in range(2, 2 + LLAMA3_NUM_SPECIAL - len(names))]
    return {name: num_ranks + i for i, name in enumerate(names)}


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Parse a tiktoken BPE file into ``{token bytes: rank}``. Raises `TokenizerError` naming the bad line."""
    ranks: dict[bytes, int] = {}
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read ({exc.strerror}); check the path") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error):
            raise TokenizerError(
                f"{path}:{lineno}: expected '<base64 token> <rank>' in a tiktoken file; re-download the file"
            ) from None
    if not ranks:
        raise TokenizerError(f"{path}: empty tiktoken file; re-download it")
    return ranks


class TiktokenTokenizer(Tokenizer):
    """tiktoken BPE tokenizer.

    Args:
      path: the tiktoken file.
      pattern: the pre-tokenizer regex (default: Llama 3's).
      special_tokens: ``{string: id}``; default: `tokenizer_config.json`'s added tokens, else Llama 3's.
      files: side-file settings; default: read from the file's folder.
    Raises `TokenizerError` on an unreadable or malformed file.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        pattern: str = LLAMA3_PATTERN,
        special_tokens: dict[str, int] | None = None,
        files: TokenizerFiles | None = None,
    ):
        path = Path(path)
        self.source = str(path)
        ranks = read_tiktoken_ranks(path)
        files = files if files is not None else read_tokenizer_files(path.parent)
        if special_tokens is None:
            added = {c: i for i, c in files.added_tokens.items() if i >= len(ranks)}
            special_tokens = added or llama3_special_tokens(len(ranks))
        self._special = dict(special_tokens)
        self._spec = EncodingSpec(pattern, ranks, self._special, name=path.stem)
        self._enc = self._spec.build()
        self._id_to_special = {i: s for s, i in self._special.items()}
        self._ranks = ranks
        self._id_to_bytes: dict[int, bytes] | None = None
        self._offsets = None  # TokenOffsets, built on the first encode_spans
        # Threads `encode_spans` encodes on: None = one per usable CPU, up to 4 (`threaded_encode`).
        self.encode_threads: int | None = None
        self._encode_helpers: EncodeHelpers | None = None
        self._setup_specials(files, bos="<|begin_of_text|>", eos="<|end_of_text|>", adds_bos=True)

    def _encode_plain(self, text: str) -> list[int]:
        return self._enc.encode(text, allowed_special="all", disallowed_special=())

    def encode_spans(self, texts: list[str]) -> list[tuple[list[int], list[int], list[int]]]:
        """For each text: ids (no BOS/EOS) and each token's start and end character offsets."""
        if self._offsets is None:
            from engine.data.tokenizers.rank_bpe import TokenOffsets

            lengths = {i: len(b) for b, i in self._ranks.items()}
            lengths.update({i: len(s.encode("utf-8")) for s, i in self._special.items()})
            self._offsets = TokenOffsets(lengths)
        offsets = self._offsets

        def encode_chunk(encoder, chunk: list[str]) -> list[list[int]]:
            return [encoder.encode(text, allowed_special="all", disallowed_special=()) for text in chunk]

        def spans(chunk: list[str], batch: list[list[int]]):
            return [(ids, *offsets.spans(text, ids)) for text, ids in zip(chunk, batch)]

        return encode_chunks(
            texts,
            encode_chunk,
            spans,
            encoder=self._enc,
            helpers=self._helpers(),
            weight=sum(map(len, texts)),
        )

    def _helpers(self) -> EncodeHelpers | None:
        """The helper threads (`encode_threads` - 1 of them, each with its own encoder), or None."""
        threads = resolve_threads(self.encode_threads)
        if threads == 1:
            return None
        if self._encode_helpers is None or self._encode_helpers.count != threads - 1:
            if self._encode_helpers is not None:
                self._encode_helpers.close()
            self._encode_helpers = EncodeHelpers(self._spec.build, threads - 1)
            weakref.finalize(self, self._encode_helpers.close)
        return self._encode_helpers

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_encode_helpers"] = None  # threads do not travel; the copy starts its own
        return state

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._id_to_special]
        return self._enc.decode(ids)

    def token_to_id(self, token: str) -> int | None:
        if token in self._special:
            return self._special[token]
        return self._ranks.get(token.encode("utf-8"))

    def id_to_token(self, token_id: int) -> str | None:
        if token_id in self._id_to_special:
            return self._id_to_special[token_id]
        if self._id_to_bytes is None:
            self._id_to_bytes = {i: b for b, i in self._ranks.items()}
        raw = self._id_to_bytes.get(token_id)
        return None if raw is None else raw.decode("utf-8", errors="replace")

    @property
    def vocab_size(self) -> int:
        return self._enc.n_vocab
