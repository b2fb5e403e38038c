"""Tokenizer from a Hugging Face `tokenizer.json`, run by the `tokenizers` library (Rust).

BOS/EOS come from `tokenizer_config.json` when present; otherwise from the file's post-processor
(the token it prepends is BOS). Whether BOS is prepended by default is what the post-processor does
on its own, unless `tokenizer_config.json` sets `add_bos_token` -- except for the Llama 3 family
(BOS ``<|begin_of_text|>``): Meta's tokenizer always starts a sequence with it, so a Llama 3
`tokenizer.json` converted without the BOS post-processor still prepends it.

`encode_spans` (many texts, with each token's character span) runs on tiktoken when the file is
rank BPE (see `rank_bpe`), on `encode_threads` threads (`threaded_encode`), else on the library's
batch encoder.
"""

from __future__ import annotations

import re
import weakref
from pathlib import Path

from engine.data.tokenizers.base import Tokenizer
from engine.data.tokenizers.hf_side_files import TokenizerFiles, read_tokenizer_files
from engine.data.tokenizers.threaded_encode import EncodeHelpers, encode_chunks, resolve_threads
from engine.data.tokenizers.tokenizer_errors import TokenizerError

LLAMA3_BOS = "<|begin_of_text|>"
# `encode_spans` switches to tiktoken (when the file is rank BPE) once this many texts have come:
# building it costs ~1-3 s (reading the JSON, the ranks, the encoder), which small datasets skip.
FAST_AFTER = 256


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
        file_adds_bos = adds_bos
        if (files.bos_token or bos) == LLAMA3_BOS and self.token_to_id(LLAMA3_BOS) is not None:
            adds_bos = True  # `add_bos_token` in tokenizer_config.json still decides (_setup_specials)
        self._path = path
        self._rank_bpe = None  # (tiktoken Encoding, TokenOffsets, special regex, ids) or False
        self._seen = 0  # texts encode_spans has encoded
        # Threads `encode_spans` encodes on (tiktoken path): None = one per usable CPU, up to 4.
        self.encode_threads: int | None = None
        self._rank_bpe_spec = None  # rank_bpe.EncodingSpec: builds the helper threads' encoders
        self._encode_helpers: EncodeHelpers | None = None
        self._setup_specials(files, bos=bos, eos=eos, adds_bos=adds_bos, file_adds_bos=file_adds_bos)

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

    def encode_spans(self, texts: list[str]) -> list[tuple[list[int], list[int], list[int]]]:
        """For each text: ids (no BOS/EOS; special-token strings map to their ids) and each token's
        start and end character offsets. A token split off inside one character spans that character."""
        self._seen += len(texts)
        fast = self._fast_encoder() if self._seen >= FAST_AFTER else False
        if fast:
            enc, offsets, special_re, special_ids = fast

            def encode_chunk(encoder, chunk: list[str]) -> list[list[int]]:
                # Special-token strings split the text (as the library's added-token matching does);
                # the pieces between them go to `encode_ordinary` (half the CPU of `encode` with
                # `allowed_special`).
                encode, out = encoder.encode_ordinary, []
                for text in chunk:
                    parts = special_re.split(text)
                    if len(parts) == 1:
                        out.append(encode(text))
                        continue
                    ids: list[int] = []
                    for k, part in enumerate(parts):
                        if k % 2:
                            ids.append(special_ids[part])
                        elif part:
                            ids += encode(part)
                    out.append(ids)
                return out

            def spans(chunk: list[str], batch: list[list[int]]):
                return [(ids, *offsets.spans(text, ids)) for text, ids in zip(chunk, batch)]

            return encode_chunks(
                texts, encode_chunk, spans, encoder=enc, helpers=self._helpers(), weight=sum(map(len, texts))
            )
        out = []
        for e in self._tok.encode_batch(texts, add_special_tokens=False):
            offs = e.offsets
            out.append((e.ids, [a for a, _ in offs], [b for _, b in offs]))
        return out

    def _helpers(self) -> EncodeHelpers | None:
        """The helper threads of the tiktoken path (`encode_threads` - 1 of them), or None for one thread."""
        threads = resolve_threads(self.encode_threads)
        spec = self._rank_bpe_spec
        if threads == 1 or spec is None:
            return None
        if self._encode_helpers is None or self._encode_helpers.count != threads - 1:
            if self._encode_helpers is not None:
                self._encode_helpers.close()
            self._encode_helpers = EncodeHelpers(spec.build, threads - 1)
            weakref.finalize(self, self._encode_helpers.close)
        return self._encode_helpers

    def _maybe_rank_bpe(self) -> bool:
        """The cheap part of `rank_bpe_encoding`'s conditions, read from the loaded tokenizer, so
        other files never parse their JSON a second time."""
        import json

        model = self._tok.model
        if self._tok.normalizer is not None or type(model).__name__ != "BPE":
            return False
        if not getattr(model, "ignore_merges", False) or getattr(model, "byte_fallback", False):
            return False
        pre = self._tok.pre_tokenizer
        return pre is not None and '"Split"' in json.dumps(json.loads(pre.__getstate__()))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_rank_bpe"] = None  # a worker process builds its own (the merge-scan verdict is on disk)
        state["_rank_bpe_spec"] = state["_encode_helpers"] = None  # and its own threads
        return state

    def _fast_encoder(self):
        if self._rank_bpe is None and not self._maybe_rank_bpe():
            self._rank_bpe = False
        if self._rank_bpe is None:
            import hashlib
            import json

            from engine.data.tokenizers.rank_bpe import TokenOffsets, rank_bpe_spec

            raw = self._path.read_bytes()
            data = json.loads(raw)
            spec = rank_bpe_spec(data, hashlib.sha256(raw).hexdigest()[:32])
            self._rank_bpe = False
            if spec is not None:
                enc, self._rank_bpe_spec = spec.build(), spec
                lengths = {i: len(t) for t, i in data["model"]["vocab"].items()}
                lengths.update({a["id"]: len(a["content"].encode("utf-8")) for a in data["added_tokens"]})
                special = {a["content"]: a["id"] for a in data["added_tokens"]}
                pattern = "|".join(re.escape(t) for t in sorted(special, key=len, reverse=True))
                self._rank_bpe = (enc, TokenOffsets(lengths), re.compile(f"({pattern})"), special)
        return self._rank_bpe

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
