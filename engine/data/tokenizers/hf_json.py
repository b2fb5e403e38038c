"""Tokenizer from a Hugging Face `tokenizer.json`, run by the `tokenizers` library (Rust).

BOS/EOS come from `tokenizer_config.json` when present; otherwise from the file's post-processor
(the token it prepends is BOS). Whether BOS is prepended by default is what the post-processor does
on its own, unless `tokenizer_config.json` sets `add_bos_token`.
"""

from __future__ import annotations

from pathlib import Path

from engine.data.tokenizers.base import Tokenizer
from engine.data.tokenizers.errors import TokenizerError
from engine.data.tokenizers.hf_config import TokenizerFiles, read_tokenizer_files


class HFTokenizer(Tokenizer):
    """`tokenizer.json` tokenizer.

    Args:
      path: the `tokenizer.json` file.
      files: side-file settings; default: read from the file's folder.
    Raises `TokenizerError` when the file is missing or not a valid tokenizer.json.
    """

    def __init__(self, path: str | Path, files: TokenizerFiles | None = None):
        from tokenizers import Tokenizer as RustTokenizer

        path = Path(path)
        self.source = str(path)
        try:
            self._tok = RustTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises plain Exception for every parse problem
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise TokenizerError(
                f"{path}: not a valid tokenizer.json ({first}); re-download it from the model's repository"
            ) from None
        files = files if files is not None else read_tokenizer_files(path.parent)
        self._special_ids = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
        # What the post-processor adds around a probe text tells BOS/EOS when no config names them.
        with_special = self._tok.encode("a", add_special_tokens=True).ids
        plain = self._tok.encode("a", add_special_tokens=False).ids
        start = with_special.index(plain[0]) if plain and plain[0] in with_special else 0
        prefix, suffix = with_special[:start], with_special[start + len(plain) :]
        bos = self.id_to_token(prefix[0]) if prefix else None
        eos = self.id_to_token(suffix[-1]) if suffix else None
        if files.bos_token is not None:
            adds_bos = bool(prefix) and prefix[0] == self.token_to_id(files.bos_token)
        else:
            adds_bos = bos is not None
        self._setup_specials(files, bos=bos, eos=eos, adds_bos=adds_bos)

    def _encode_plain(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str], add_bos: bool = True, add_eos: bool = True) -> list[list[int]]:
        """`encode` for many texts at once (parallel in the Rust library)."""
        plain = [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]
        out = []
        for ids in plain:
            if add_bos and self.adds_bos and (not ids or ids[0] != self.bos_id):
                ids = [self.bos_id, *ids]
            if add_eos and self.eos_id is not None:
                ids = [*ids, self.eos_id]
            out.append(ids)
        return out

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def special_ids(self) -> set[int]:
        """Ids of the file's special added tokens."""
        return set(self._special_ids)
