"""Tokenizer from a SentencePiece `tokenizer.model` (Llama 2, Mistral v0.1, Gemma, ...).

SentencePiece does not recognise special-token strings in text, so `encode` first splits the text
on the control pieces (``<s>``, ``</s>``, ...) and on tokens named in `tokenizer_config.json`'s
`added_tokens_decoder`, encodes the plain segments and inserts the special ids between them.
"""

from __future__ import annotations

import re
from pathlib import Path

from engine.data.tokenizers.base import Tokenizer
from engine.data.tokenizers.hf_side_files import TokenizerFiles, read_tokenizer_files
from engine.data.tokenizers.tokenizer_errors import TokenizerError


class SentencePieceTokenizer(Tokenizer):
    """SentencePiece tokenizer.

    Args:
      path: the `.model` file (a serialized SentencePiece ModelProto).
      files: side-file settings; default: read from the file's folder. BOS is prepended by default
        (the SentencePiece convention) unless `tokenizer_config.json` sets `add_bos_token: false`.
    Raises `TokenizerError` when the file is missing or not a SentencePiece model.
    """

    def __init__(self, path: str | Path, files: TokenizerFiles | None = None):
        import sentencepiece as spm

        path = Path(path)
        self.source = str(path)
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.Load(str(path))
        except (OSError, RuntimeError) as exc:
            raise TokenizerError(
                f"{path}: not a SentencePiece model ({str(exc).splitlines()[0]}); re-download tokenizer.model"
            ) from None
        files = files if files is not None else read_tokenizer_files(path.parent)
        n = self._sp.GetPieceSize()
        # Special pieces: control (<s>, </s>) and unknown pieces, plus config-added tokens.
        self._special: dict[str, int] = {}
        for i in range(n):
            if self._sp.IsControl(i) or self._sp.IsUnknown(i):
                self._special[self._sp.IdToPiece(i)] = i
        self._extra: dict[int, str] = {}  # added tokens beyond the SentencePiece vocabulary
        for i, content in files.added_tokens.items():
            if i >= n:
                self._extra[i] = content
            self._special.setdefault(content, i)
        self._vocab_size = max([n, *(i + 1 for i in self._extra)])
        splittable = sorted((s for s in self._special if s), key=len, reverse=True)
        self._split_re = re.compile("(" + "|".join(map(re.escape, splittable)) + ")") if splittable else None

        def piece(i: int) -> str | None:
            return self._sp.IdToPiece(i) if i >= 0 else None

        self._setup_specials(
            files,
            bos=piece(self._sp.bos_id()),
            eos=piece(self._sp.eos_id()),
            pad=piece(self._sp.pad_id()),
            unk=piece(self._sp.unk_id()),
            adds_bos=True,
        )

    def _encode_plain(self, text: str) -> list[int]:
        if self._split_re is None:
            return list(self._sp.EncodeAsIds(text))
        ids: list[int] = []
        for part in self._split_re.split(text):
            if not part:
                continue
            special = self._special.get(part)
            if special is not None:
                ids.append(special)
            else:
                ids.extend(self._sp.EncodeAsIds(part))
        return ids

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        out: list[str] = []
        run: list[int] = []
        for i in ids:
            if i in self._extra or (
                i < self._sp.GetPieceSize() and (self._sp.IsControl(i) or self._sp.IsUnknown(i))
            ):
                if run:
                    out.append(self._sp.DecodeIds(run))
                    run = []
                if not skip_special_tokens:
                    out.append(self.id_to_token(i) or "")
            else:
                run.append(i)
        if run:
            out.append(self._sp.DecodeIds(run))
        return "".join(out)

    def token_to_id(self, token: str) -> int | None:
        if token in self._special:
            return self._special[token]
        i = self._sp.PieceToId(token)
        return None if i == self._sp.unk_id() and token != self._sp.IdToPiece(i) else i

    def id_to_token(self, token_id: int) -> str | None:
        if token_id in self._extra:
            return self._extra[token_id]
        if 0 <= token_id < self._sp.GetPieceSize():
            return self._sp.IdToPiece(token_id)
        return None

    @property
    def vocab_size(self) -> int:
        return self._vocab_size
