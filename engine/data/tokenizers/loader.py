"""`load_tokenizer(path)`: pick the tokenizer backend from what is on disk."""

from __future__ import annotations

import re
from pathlib import Path

from engine.data.tokenizers.base import Tokenizer
from engine.data.tokenizers.tokenizer_errors import TokenizerError

_TIKTOKEN_LINE = re.compile(rb"^[A-Za-z0-9+/]+=*[ \t]+\d+\r?$")


def _is_tiktoken_file(path: Path) -> bool:
    """A tiktoken file is text whose first line is '<base64> <rank>'; SentencePiece models are protobuf."""
    try:
        with path.open("rb") as fh:
            first = fh.readline(512).rstrip(b"\n")
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read ({exc.strerror}); check the path") from None
    return bool(_TIKTOKEN_LINE.match(first))


def _load_file(path: Path) -> Tokenizer:
    if path.suffix == ".json":
        from engine.data.tokenizers.hf_json import HFTokenizer

        return HFTokenizer(path)
    if path.suffix == ".tiktoken" or _is_tiktoken_file(path):
        from engine.data.tokenizers.tiktoken_model import TiktokenTokenizer

        return TiktokenTokenizer(path)
    from engine.data.tokenizers.sentencepiece_model import SentencePieceTokenizer

    return SentencePieceTokenizer(path)


def find_tokenizer_file(folder: Path) -> Path | None:
    """The tokenizer file of a model folder: `tokenizer.json` first (fastest, most complete), then
    `tokenizer.model` (SentencePiece or tiktoken), then a lone `*.tiktoken` or `*.model` file."""
    for name in ("tokenizer.json", "tokenizer.model"):
        if (folder / name).is_file():
            return folder / name
    for pattern in ("*.tiktoken", "*.model"):
        found = sorted(folder.glob(pattern))
        if len(found) == 1:
            return found[0]
    return None


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load the tokenizer at `path`: a model folder, or a `tokenizer.json`, SentencePiece `.model`,
    or tiktoken file. Side files in the same folder (`tokenizer_config.json`, `special_tokens_map.json`,
    `generation_config.json`, `chat_template.jinja`) set special tokens, BOS use and the chat template.

    Raises `TokenizerError` (a `ConfigError`) when nothing usable is there, naming the path.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        found = find_tokenizer_file(path)
        if found is None:
            raise TokenizerError(
                f"{path}: no tokenizer.json, tokenizer.model or *.tiktoken file in this folder; "
                "point `tokenizer.path` at the model folder that has one"
            )
        return _load_file(found)
    if path.is_file():
        return _load_file(path)
    raise TokenizerError(f"{path}: no such tokenizer file or folder; check `tokenizer.path`")
