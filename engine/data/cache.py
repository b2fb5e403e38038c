"""On-disk cache of tokenized datasets.

Entries live under ``$TUNEBENCH_HOME/cache/data/<key>.npz`` (``TUNEBENCH_HOME`` defaults to
``~/.tunebench``). The key is a SHA-256 over everything that decides the tokens: the builder, the
source's fingerprint (path, size and mtime of each local file; name/subset/split for the Hub), the
tokenizer's fingerprint, the transform and template, the chat format and the settings. Entries are
written to a temporary file and renamed, so a crash never leaves half an entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

CACHE_VERSION = 2  # 2: torchtune label layout, masks from token spans, Llama 3 BOS
_PROBE = "Hello world! 0123 <|im_start|>[INST] <s></s> ünïcødé\n\n  tabs\t."


def cache_dir() -> Path:
    """``$TUNEBENCH_HOME/cache/data``."""
    home = Path(os.environ.get("TUNEBENCH_HOME", "~/.tunebench")).expanduser()
    return home / "cache" / "data"


def tokenizer_fingerprint(tokenizer) -> str:
    """Identity of a tokenizer: its class, file, vocabulary size, special ids and a probe encoding."""
    parts = [
        type(tokenizer).__name__,
        str(getattr(tokenizer, "source", "")),
        str(getattr(tokenizer, "vocab_size", "")),
        str(getattr(tokenizer, "bos_id", None)),
        str(getattr(tokenizer, "eos_id", None)),
        str(getattr(tokenizer, "pad_id", None)),
        str(getattr(tokenizer, "adds_bos", None)),
        str(getattr(tokenizer, "chat_template", None)),
        ",".join(map(str, tokenizer.encode(_PROBE, add_bos=False, add_eos=False))),
    ]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def cache_key(**parts: Any) -> str:
    """SHA-256 of the JSON of `parts` (reprs for non-JSON values) plus the cache version."""
    blob = json.dumps({"v": CACHE_VERSION, **parts}, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def load(key: str) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """Arrays and metadata of entry `key`, or None when absent or unreadable."""
    path = cache_dir() / f"{key}.npz"
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k != "__meta__"}
            meta = json.loads(bytes(z["__meta__"]).decode())
        return arrays, meta
    except (OSError, ValueError, KeyError):
        return None


def save(key: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write entry `key` atomically; a read-only or full disk leaves no entry (the cache is optional)."""
    folder = cache_dir()
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as f:
            meta_arr = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
            np.savez(f, __meta__=meta_arr, **arrays)
        os.replace(tmp, folder / f"{key}.npz")
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def clear() -> int:
    """Delete every cached dataset (and stray temporary files); returns how many files were removed."""
    folder = cache_dir()
    removed = 0
    if folder.is_dir():
        for f in list(folder.glob("*.npz")) + list(folder.glob("*.npz.tmp")):
            f.unlink(missing_ok=True)
            removed += 1
    return removed
