"""tiktoken as the encoder of a byte-level `tokenizer.json` whose BPE is rank BPE (Llama 3's).

Llama 3's `tokenizer.json` was converted from a tiktoken file: ids are the tiktoken ranks and the merge
list holds every split of every token. For such a file the `tokenizers` library and tiktoken produce
the same ids, and tiktoken does it several times faster. `rank_bpe_encoding` checks the conditions
that make the two algorithms equal and builds the tiktoken `Encoding` only when every one holds:

- no normalizer; pre-tokenizer = one regex `Split` (isolated) then `ByteLevel` without its own regex;
- a BPE model without dropout, unknown token, byte fallback or sub-word affixes, with
  ``ignore_merges`` (a whole pre-token found in the vocabulary is one token, as in tiktoken);
- added tokens without strip/normalisation flags (tiktoken matches special strings verbatim);
- merge priority order = rank order of the merged token, and every split of a token into two
  vocabulary entries of lower rank is a listed merge (what tiktoken may merge, the library may too).

`TokenOffsets` turns ids into character offsets from each token's byte length, which the data
pipeline uses to place prompt/response boundaries without encoding the text twice.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

import numpy as np


def byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet: printable bytes stand for themselves, the rest map to U+0100 on."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def _split_pattern(data: dict[str, Any]) -> str | None:
    pre = data.get("pre_tokenizer") or {}
    if pre.get("type") != "Sequence" or len(pre.get("pretokenizers", [])) != 2:
        return None
    split, level = pre["pretokenizers"]
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert"):
        return None
    if level.get("type") != "ByteLevel" or level.get("use_regex") or level.get("add_prefix_space"):
        return None
    return (split.get("pattern") or {}).get("Regex")


class EncodingSpec:
    """What builds a tiktoken `Encoding`: pre-tokenizer `pattern`, ``{bytes: rank}`` `ranks`,
    ``{string: id}`` `special`, and its `name`. `build()` makes a new one (~0.08 s for Llama 3), e.g.
    one per thread."""

    def __init__(
        self, pattern: str, ranks: dict[bytes, int], special: dict[str, int], name: str = "tokenizer_json"
    ):
        self.pattern, self.ranks, self.special, self.name = pattern, ranks, special, name

    def build(self):
        import tiktoken

        return tiktoken.Encoding(
            name=self.name, pat_str=self.pattern, mergeable_ranks=self.ranks, special_tokens=self.special
        )


def rank_bpe_encoding(data: dict[str, Any], digest: str):
    """A tiktoken `Encoding` equal to the `tokenizer.json` `data`, or None when the file is not rank BPE.
    `digest`: a hash of the file, naming the kept answer of the merge scan."""
    spec = rank_bpe_spec(data, digest)
    return None if spec is None else spec.build()


def rank_bpe_spec(data: dict[str, Any], digest: str) -> EncodingSpec | None:
    """`rank_bpe_encoding`'s checks; the `EncodingSpec` of the equal tiktoken encoder, or None."""
    model = data.get("model") or {}
    pattern = _split_pattern(data)
    if (
        pattern is None
        or data.get("normalizer") is not None
        or model.get("type") != "BPE"
        or not model.get("ignore_merges")
        or model.get("dropout") is not None
        or model.get("unk_token") is not None
        or model.get("byte_fallback")
        or model.get("continuing_subword_prefix")
        or model.get("end_of_word_suffix")
    ):
        return None
    added = data.get("added_tokens") or []
    if any(a.get("lstrip") or a.get("rstrip") or a.get("normalized") or a.get("single_word") for a in added):
        return None
    try:
        import tiktoken  # noqa: F401
    except ImportError:  # optional speed-up; the `tokenizers` library path is used without it
        return None
    to_latin1 = str.maketrans({c: chr(b) for c, b in byte_level_alphabet().items()})
    vocab: dict[str, int] = model["vocab"]
    try:  # byte-level characters -> the bytes they stand for
        ranks = {tok.translate(to_latin1).encode("latin-1"): i for tok, i in vocab.items()}
    except UnicodeEncodeError:  # a character outside the byte-level alphabet: not a byte-level vocabulary
        return None
    if len(ranks) != len(vocab) or sorted(ranks.values()) != list(range(len(ranks))):
        return None
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]
    last = -1
    for a, b in merges:  # priority order must be the merged token's rank order
        r = vocab.get(a + b)
        if r is None or r < last:
            return None
        last = r
    if not _verdict(digest, merges, vocab):
        return None
    special = {a["content"]: a["id"] for a in added}
    if any(i < len(ranks) for i in special.values()):
        return None
    return EncodingSpec(pattern, ranks, special)


_VERDICTS: dict[str, bool] = {}


def _verdict(digest: str, merges: list[tuple[str, ...]], vocab: dict[str, int]) -> bool:
    """Every split of a token into two lower-rank vocabulary entries is a listed merge. The scan
    (~1M look-ups for Llama 3) runs once per vocabulary and process; the answer is also kept under
    ``$TUNEBENCH_HOME/cache/tokenizers`` under the file's `digest`."""
    import json
    import os
    from pathlib import Path

    if digest in _VERDICTS:
        return _VERDICTS[digest]
    home = Path(os.environ.get("TUNEBENCH_HOME", "~/.tunebench")).expanduser()
    path = home / "cache" / "tokenizers" / f"rank_bpe_{digest}.json"
    try:
        ok = bool(json.loads(path.read_text())["rank_bpe"])
    except (OSError, ValueError, KeyError, TypeError):
        listed = set(merges)
        ok = True
        for tok, r in vocab.items():
            for k in range(1, len(tok)):
                a, b = tok[:k], tok[k:]
                ra, rb = vocab.get(a), vocab.get(b)
                if ra is not None and rb is not None and ra < r and rb < r and (a, b) not in listed:
                    ok = False
                    break
            if not ok:
                break
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"rank_bpe": ok}))
            tmp.replace(path)
        except OSError:  # a read-only home only costs the scan next time
            pass
    _VERDICTS[digest] = ok
    return ok


class TokenOffsets:
    """Character end offsets of tokens from each id's byte length (byte-level vocabularies).

    Args:
      byte_lengths: ``{id: number of UTF-8 bytes the token stands for}`` for every id.
    """

    def __init__(self, byte_lengths: dict[int, int]):
        size = max(byte_lengths) + 1
        self._len = np.zeros(size, dtype=np.int64)
        for i, n in byte_lengths.items():
            self._len[i] = n
        self._len_list = self._len.tolist()

    def spans(self, text: str, ids: list[int]) -> tuple[list[int], list[int]]:
        """Start and end character offsets in `text` of each token (a character split across tokens
        belongs to each of them)."""
        if not ids:
            return [], []
        if text.isascii():  # bytes = characters; plain iterators beat numpy on short token lists
            ends = list(accumulate(map(self._len_list.__getitem__, ids)))
            return [0, *ends[:-1]], ends
        lengths = self._len[np.asarray(ids, dtype=np.int64)]
        byte_ends = np.cumsum(lengths)
        byte_starts = byte_ends - lengths
        raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        # Character index of each byte: count of character-starting bytes (not 10xxxxxx) so far.
        char_of_byte = np.append(np.cumsum((raw & 0xC0) != 0x80) - 1, 0)
        return char_of_byte[byte_starts].tolist(), (char_of_byte[byte_ends - 1] + 1).tolist()
